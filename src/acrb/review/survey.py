"""Import an existing web-survey export of human ratings as review items and ratings.

The export is a JSON list with one object per (rater, item): the fields of
:data:`BASE_FIELDS` and, per output shown, one score per survey axis prefixed ``edited_`` (the
edit the audit rates) and ``preserved_`` (the output of the feature prompt, shown beside it):
in the study's survey ``edit_success``, ``skin_tone``, ``race_drift``, ``gender_drift``,
``age_drift``, each 1-5 (``null`` = the rater could not tell). The ``edited_`` scores are
required; the ``preserved_`` ones are all present or all absent (an item shown alone).
``createdAt`` is an ISO 8601 time (Firebase's export writes it ``"__Timestamp__<ISO time>"``),
epoch milliseconds, or a Firestore ``{"_seconds", "_nanoseconds"}`` object.

**Scales.** Every survey axis is read through its declared scale
(:mod:`acrb.review.scales`; the study's survey by default, another export's with a YAML file):
the bipolar age item becomes both ``age_direction`` (1-5, 3 = no change, as the study rubric's
judges score it) and ``age_change`` (drift), the other axes are the same scales as ACRB's. A
score field whose axis is not declared is refused.

What it becomes:

- one :class:`acrb.records.ReviewItemRecord` per ``itemId``: ``request_id`` None (ACRB did
  not generate it; the ``review`` stage matches it to a request of the run where it can),
  image paths ``""`` (unknown), ``source_id`` = ``originalItemId``, ``random_sample`` True
  (the survey's items were its sample), instruction ``""``; ``metadata`` keeps ``category``;
- one :class:`acrb.records.RatingRecord` per record and output shown: ``edited`` from the
  ``edited_`` scores, ``feature`` from the ``preserved_`` ones; ``shown_first`` from
  ``editedShownFirst``; ``origin`` = ``survey:<first 12 hex digits of the file's sha256>``;
  ``metadata`` = every further key of the record (``taskId``, image URLs, ...), as canonical
  JSON. Keys that identify a person (:data:`PERSONAL_KEYS`) are kept only as keyed hashes, and
  the raw ``userId`` inside any kept string (Firebase's ``evalId`` is ``<userId>_<itemId>``)
  is replaced by the rater's pseudonym.

Raters are pseudonymised: ``rater`` = ``survey-`` + HMAC-SHA256 of the ``userId`` keyed with
the file's sha256, first 16 hex digits. The raw id (often an e-mail address) is never written;
a plain hash of an e-mail could be reversed by hashing guesses, the keyed one only by someone
who holds the export itself. The same file always gives the same pseudonyms.

Bad files are refused with an :class:`acrb.errors.InputDataError` that names the record index
and the field: not a list, a record that is not an object, a key a record repeats (JSON would
keep the last), a missing field, a score outside 1-5, a ``duration_ms`` that is negative or
beyond a 64-bit integer, a score field of an undeclared axis, a group label outside the
vocabulary, an item whose labels change between records, or a (``userId``, ``itemId``) pair
rated twice; and, naming the file, what JSON cannot read (:mod:`acrb.yaml_input`). Nothing is
written until the whole file is read, and the outputs are replaced as one set
(:func:`write_survey`).
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
from acrb.review.scales import SurveyScales, load_scales, read_answer
from acrb.sources.fairface import LABELS
from acrb.storage import atomic_paths, content_hash, sha256_bytes, write_csv
from acrb.yaml_input import RepeatedKeyError, json_location, parse_json, read_input_bytes

#: Fields every record carries.
BASE_FIELDS: tuple[str, ...] = ("userId", "itemId", "originalItemId", "model", "promptId",
                                "category", "race", "gender", "age", "editedShownFirst",
                                "duration_ms", "createdAt")
#: The study's survey axes (their scales: :data:`acrb.review.scales.SURVEY_SCALES`).
SCORE_FIELDS: tuple[str, ...] = ("edit_success", "skin_tone", "race_drift", "gender_drift",
                                 "age_drift")
#: Extra keys that identify a person: kept in metadata only as a keyed hash.
PERSONAL_KEYS: frozenset[str] = frozenset({"userEmail", "email", "prolificPid",
                                           "prolificSessionId", "workerId", "assignmentId"})
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


#: The prefix Firebase's JSON export writes before a Firestore timestamp's ISO time.
TIMESTAMP_PREFIX = "__Timestamp__"


def _created_at(path: Path, index: int, record: Mapping[str, Any]) -> str:
    """``createdAt`` as ISO 8601 UTC: an ISO string (with or without Firebase's
    ``__Timestamp__`` prefix), epoch milliseconds, or ``{"_seconds", "_nanoseconds"}``."""
    value = record["createdAt"]
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, dict):
            seconds = value.get("_seconds", value.get("seconds"))
            nanos = value.get("_nanoseconds", value.get("nanoseconds", 0))
            if isinstance(seconds, bool) or not isinstance(seconds, int) \
                    or isinstance(nanos, bool) or not isinstance(nanos, int):
                raise ValueError
            moment = datetime.fromtimestamp(seconds + nanos / 1e9, tz=timezone.utc)
        elif isinstance(value, int | float):
            moment = datetime.fromtimestamp(value / 1000, tz=timezone.utc)
        elif isinstance(value, str):
            text = value.strip().removeprefix(TIMESTAMP_PREFIX).strip()
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
        else:
            raise ValueError
    except (ValueError, OverflowError, OSError):
        raise _bad(path, index, "createdAt", f"expected an ISO 8601 time (optionally "
                   f"{TIMESTAMP_PREFIX!r}-prefixed), epoch milliseconds or "
                   f"{{'_seconds', '_nanoseconds'}}, got {value!r}") from None
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


#: The largest ``duration_ms`` a table column (64-bit integers) holds: about 292 million years.
MAX_DURATION_MS = 2**63 - 1


def _duration(path: Path, index: int, record: Mapping[str, Any]) -> int | None:
    value = record["duration_ms"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
            or not math.isfinite(value):
        raise _bad(path, index, "duration_ms", f"expected milliseconds >= 0 or null, "
                   f"got {value!r}")
    if int(value) > MAX_DURATION_MS:
        raise _bad(path, index, "duration_ms", f"{value!r} milliseconds is more than a table "
                   f"holds ({MAX_DURATION_MS:,}, 64-bit integers); no rating takes that long")
    return int(value)


def _shown_first(path: Path, index: int, record: Mapping[str, Any]) -> bool | None:
    value = record["editedShownFirst"]
    if value is not None and not isinstance(value, bool):
        raise _bad(path, index, "editedShownFirst", f"expected true, false or null, "
                   f"got {value!r}")
    return value


def _keyed(value: str, key: str) -> str:
    return hmac.new(key.encode(), value.encode("utf-8"), hashlib.sha256).hexdigest()[:16]


def pseudonym(user_id: str, key: str) -> str:
    """The rater id written for ``user_id``: keyed hash (see the module docstring)."""
    return f"survey-{_keyed(user_id, key)}"


def _without_user(value: Any, user: str, rater: str) -> Any:
    """``value`` (JSON) with the raw user id replaced by the rater's pseudonym in every
    string."""
    if isinstance(value, str):
        return value.replace(user, rater)
    if isinstance(value, list):
        return [_without_user(v, user, rater) for v in value]
    if isinstance(value, dict):
        return {k: _without_user(v, user, rater) for k, v in value.items()}
    return value


def _metadata(record: Mapping[str, Any], read: set[str], user: str, rater: str,
              key: str) -> str:
    """The record's keys beyond ``read`` as canonical JSON, personal ones as keyed hashes."""
    extra: dict[str, Any] = {}
    for name in sorted(set(record) - read):
        value = record[name]
        if name in PERSONAL_KEYS and value is not None:
            extra[name] = f"hmac-{_keyed(str(value), key)}"
        else:
            extra[name] = _without_user(value, user, rater)
    return json.dumps(extra, sort_keys=True, separators=(",", ":"), ensure_ascii=False) \
        if extra else ""


def _score_fields(path: Path, index: int, record: Mapping[str, Any],
                  scales: SurveyScales) -> None:
    """Refuse a score field whose survey axis has no declared scale."""
    for name in record:
        for prefix in PREFIXES:
            if name.startswith(prefix) and name[len(prefix):] not in scales.axes:
                raise _bad(path, index, name, f"survey axis {name[len(prefix):]!r} has no "
                           f"declared scale (declared: {sorted(scales.axes)}); declare it "
                           "in a scales file (acrb review import-survey --scales), `scale: "
                           "ignore` to keep it as metadata only")


def _load(path: Path) -> tuple[list[Any], str]:
    """The export's records and the sha256 of its bytes (:mod:`acrb.yaml_input` refuses what
    JSON cannot read as published, a key a record repeats included)."""
    fix = "give the path of the survey's JSON export"
    if not path.is_file():
        raise InputDataError(f"{path} does not exist or is not a file", fix)
    data = read_input_bytes(path, what="survey export", missing_fix=fix)
    try:
        records = parse_json(data, path, what="survey export")
    except RepeatedKeyError as exc:
        if not exc.location or not isinstance(exc.location[0], int):
            raise
        index, inside = exc.location[0], exc.location[1:]
        field = exc.keys[0] if not inside else json_location(inside)
        raise _bad(path, index, field, (f"{exc.repeats} in the record" if not inside else
                                        f"{exc.repeats} in this object")
                   + " (JSON would keep only the last)") from None
    if not isinstance(records, list):
        raise InputDataError(f"{path}: expected a JSON list of rating records, got a "
                             f"{type(records).__name__}", _FIX)
    if not records:
        raise InputDataError(f"{path}: the list of rating records is empty", _FIX)
    return records, sha256_bytes(data)


def import_survey(path: Path | str, scales: SurveyScales | Path | str | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read a survey export: (items, ratings) frames of :class:`ReviewItemRecord` and
    :class:`RatingRecord` rows, validated (module docstring for the mapping and the checks).
    ``scales``: the survey's scale declaration, or a YAML file of one; default the study's
    survey (:data:`acrb.review.scales.SURVEY_SCALES`)."""
    path = Path(path)
    if not isinstance(scales, SurveyScales):
        scales = load_scales(scales)
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
        _score_fields(path, index, record, scales)
        rater = pseudonym(user, file_hash)
        if (rater, item_id) in seen:
            raise _bad(path, index, "itemId", f"this user already rated item {item_id!r} in "
                       f"record {seen[(rater, item_id)]}: one rating per user and item")
        seen[(rater, item_id)] = index
        shown_first = _shown_first(path, index, record)
        duration = _duration(path, index, record)
        created_at = _created_at(path, index, record)
        outputs: list[tuple[ReviewOutput, dict[str, int | None]]] = []
        read = set(BASE_FIELDS)
        for prefix, output in PREFIXES.items():
            fields = [f"{prefix}{name}" for name in scales.axes]
            present = [f for f in fields if f in record]
            if output == "feature" and not present:
                continue  # shown alone: no feature-prompt output
            for field in fields:
                if field not in record:
                    raise _bad(path, index, field, "missing" + (
                        " (the other preserved_ scores are present)" if output == "feature"
                        else ""))
            scores: dict[str, int | None] = {}
            for name, declared in scales.axes.items():
                if declared.scale == "ignore":
                    continue  # kept in the metadata
                read.add(f"{prefix}{name}")
                scores.update(read_answer(scales, name,
                                          _score(path, index, record, f"{prefix}{name}")))
            outputs.append((output, scores))
        metadata = _metadata(record, read, user, rater, file_hash)
        paired = len(outputs) == 2
        for output, scores in outputs:
            first_shown = None
            if paired and shown_first is not None:
                first_shown = shown_first if output == "edited" else not shown_first
            ratings.append(RatingRecord(
                rating_id=content_hash([origin, rater, item_id, output]), rater=rater,
                item_id=item_id, output=output, shown_first=first_shown, repeat=False,
                duration_ms=duration, created_at=created_at, origin=origin,
                metadata=metadata, **scores))
        item = items.setdefault(item_id, {"paired": False, **labels})
        item["paired"] = item["paired"] or paired
    item_rows = [ReviewItemRecord(
        item_id=item_id, request_id=None, paired_request_id=None, model=item["model"],
        prompt_id=item["promptId"], instruction="", source_id=item["originalItemId"],
        source_path="", output_path="", paired_output_path="" if item["paired"] else None,
        race=item["race"], gender=item["gender"], age=item["age"], random_sample=True,
        needs_review=False, metadata=json.dumps(
            {"category": item["category"], "survey_model": item["model"]}, sort_keys=True,
            separators=(",", ":"))) for item_id, item in items.items()]
    items_frame = pd.DataFrame([r.model_dump() for r in item_rows],
                               columns=list(ReviewItemRecord.model_fields))
    ratings_frame = pd.DataFrame([r.model_dump() for r in ratings],
                                 columns=list(RatingRecord.model_fields))
    return items_frame, ratings_frame


def write_survey(path: Path | str, out_dir: Path | str,
                 scales: SurveyScales | Path | str | None = None) -> dict[str, Path]:
    """Import a survey export (scales as :func:`import_survey`) and write its items and
    ratings as Parquet tables in ``out_dir`` (the file names of ``inputs/review/``:
    ``items.parquet``, ``ratings.parquet``) and the ratings as ``ratings.csv``, as one set:
    all three are written under temporary names and renamed into place only once every one
    was written, so a failure keeps the previous three. Returns the paths written, keyed
    ``items``, ``ratings`` and ``ratings_csv``."""
    items, ratings = import_survey(path, scales)
    out = Path(out_dir)
    written = {"items": out / REVIEW_ITEMS_TABLE.name, "ratings": out / RATINGS_TABLE.name,
               "ratings_csv": out / "ratings.csv"}
    # One set: the ratings refer to the items, so a failure while any is written (a full disk)
    # leaves the previous three as they were, never new items beside old ratings.
    with atomic_paths(list(written.values())) as (items_tmp, ratings_tmp, csv_tmp):
        write_table(items_tmp, items, ReviewItemRecord)
        write_table(ratings_tmp, ratings, RatingRecord)
        write_csv(ratings, csv_tmp)
    return written


__all__ = ["BASE_FIELDS", "PERSONAL_KEYS", "PREFIXES", "SCORE_FIELDS", "TIMESTAMP_PREFIX",
           "import_survey", "pseudonym", "write_survey"]
