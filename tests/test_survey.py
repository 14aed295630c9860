"""Import of a survey export (acrb.review.survey) on files of the export's shape made here:
the mapping to review items and ratings, pseudonymous raters, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from acrb.analysis.agreement import rater_agreement
from acrb.errors import InputDataError
from acrb.records import RatingRecord, ReviewItemRecord, read_table
from acrb.review.survey import import_survey, pseudonym, write_survey
from acrb.storage import sha256_file

SCORES = ("edit_success", "skin_tone", "race_drift", "gender_drift", "age_drift")


def record(user: str = "ana@example.org", item: str = "it-1", *, preserved: bool = True,
           edited_first: bool | None = True, **overrides: Any) -> dict[str, Any]:
    """One record of the export's shape."""
    row: dict[str, Any] = {
        "userId": user, "itemId": item, "originalItemId": f"src-{item}", "model": "flux",
        "promptId": "A-03", "category": "A", "race": "Black", "gender": "Female",
        "age": "20-29", "editedShownFirst": edited_first, "duration_ms": 5400,
        "createdAt": "2025-03-04T10:11:12.000Z",
    }
    row.update({f"edited_{name}": value for name, value in zip(SCORES, (2, 4, 1, 1, 2),
                                                                strict=True)})
    if preserved:
        row.update({f"preserved_{name}": value for name, value in zip(SCORES, (5, 3, 1, 1, 1),
                                                                      strict=True)})
    row.update(overrides)
    return row


def export(tmp_path: Path, records: Any, name: str = "survey.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(records))
    return path


def test_records_become_items_and_ratings(tmp_path: Path) -> None:
    path = export(tmp_path, [
        record(),
        record("bo@example.org", edited_first=False, edited_skin_tone=None),
        record("ana@example.org", "it-2", preserved=False, race="Latino_Hispanic",
               age="70plus", createdAt=1_700_000_000_000),
    ])
    items, ratings = import_survey(path)
    assert list(items.columns) == list(ReviewItemRecord.model_fields)
    assert list(ratings.columns) == list(RatingRecord.model_fields)
    by_item = items.set_index("item_id")
    assert list(by_item.index) == ["it-1", "it-2"]
    assert by_item.loc["it-1", "source_id"] == "src-it-1"
    assert by_item.loc["it-1", "age"] == "20s"  # FairFace's bin, ACRB's spelling
    assert by_item.loc["it-2", "race"] == "Latino" and by_item.loc["it-2", "age"] == "70plus"
    assert by_item.loc["it-1", "paired_output_path"] == ""
    assert pd.isna(by_item.loc["it-2", "paired_output_path"])
    assert by_item["request_id"].isna().all() and by_item["random_sample"].all()
    assert len(ratings) == 5  # two outputs, two outputs, one output
    origin = f"survey:{sha256_file(path)[:12]}"
    assert (ratings["origin"] == origin).all()
    ana = ratings[(ratings["item_id"] == "it-1")
                  & (ratings["rater"] == pseudonym("ana@example.org", sha256_file(path)))]
    edited = ana[ana["output"] == "edited"].iloc[0]
    feature = ana[ana["output"] == "feature"].iloc[0]
    assert (edited["edit_success"], edited["skin_tone"], edited["race_change"],
            edited["age_change"]) == (2, 4, 1, 2)
    assert (feature["edit_success"], feature["skin_tone"], feature["age_change"]) == (5, 3, 1)
    assert edited["shown_first"] is True and feature["shown_first"] is False
    bo = ratings[ratings["rater"] == pseudonym("bo@example.org", sha256_file(path))]
    assert pd.isna(bo[bo["output"] == "edited"]["skin_tone"].iloc[0])  # cannot tell
    assert bo[bo["output"] == "edited"]["shown_first"].iloc[0] is False
    single = ratings[ratings["item_id"] == "it-2"].iloc[0]
    assert single["output"] == "edited" and single["shown_first"] is None
    assert single["created_at"] == "2023-11-14T22:13:20Z"
    assert edited["created_at"] == "2025-03-04T10:11:12Z" and edited["duration_ms"] == 5400
    assert ratings["rating_id"].is_unique


def test_raw_user_ids_never_written(tmp_path: Path) -> None:
    path = export(tmp_path, [record(), record("bo@example.org")])
    written = write_survey(path, tmp_path / "out")
    for file in written.values():
        assert b"example.org" not in file.read_bytes()
    ratings = read_table(written["ratings"], RatingRecord)
    assert ratings["rater"].str.fullmatch(r"survey-[0-9a-f]{16}").all()
    assert ratings["rater"].nunique() == 2
    items = read_table(written["items"], ReviewItemRecord)
    assert len(items) == 1 and written["items"].name == "items.parquet"
    # The same file gives the same pseudonyms; another file (another key) others.
    again = import_survey(path)[1]
    assert set(again["rater"]) == set(ratings["rater"])
    other = import_survey(export(tmp_path, [record(), record("bo@example.org"),
                                            record(item="it-9")], "other.json"))[1]
    assert not set(other["rater"]) & set(ratings["rater"])


def test_imported_ratings_feed_the_agreement_table(tmp_path: Path) -> None:
    rows = [record(f"user{u}", f"it-{i}", edited_edit_success=1 + i % 5)
            for u in range(3) for i in range(6)]
    items, ratings = import_survey(export(tmp_path, rows))
    table = rater_agreement(ratings, items, axes=("edit_success",), outputs=("edited",),
                            n_boot=20)
    overall = table[(table["dimension"] == "all")]
    assert (overall["estimate"] == 1.0).all() and (overall["n_units"] == 6).all()


@pytest.mark.parametrize(("records", "message"), [
    ({"userId": "x"}, "expected a JSON list"),
    ([], "empty"),
    ([record(), "text"], "record 1 is a str"),
    ([record(), {k: v for k, v in record().items() if k != "promptId"}],
     "record 1, field 'promptId': missing"),
    ([{k: v for k, v in record().items() if k != "edited_age_drift"}],
     "record 0, field 'edited_age_drift': missing"),
    ([{k: v for k, v in record().items() if k != "preserved_skin_tone"}],
     "record 0, field 'preserved_skin_tone': missing"),
    ([record(), record("bo", edited_skin_tone=6)], "record 1, field 'edited_skin_tone'.*1-5"),
    ([record(preserved_edit_success=0)], "field 'preserved_edit_success'.*outside 1-5"),
    ([record(edited_race_drift=2.5)], "field 'edited_race_drift'.*whole number"),
    ([record(edited_gender_drift="3")], "field 'edited_gender_drift'.*score 1-5"),
    ([record(edited_gender_drift=True)], "field 'edited_gender_drift'"),
    ([record(), record(), record()], "record 1, field 'itemId'.*already rated"),
    ([record(race="Martian")], "record 0, field 'race'.*'Martian'"),
    ([record(), record("bo", model="other")], "record 1, field 'model'.*record 0"),
    ([record(createdAt="yesterday")], "field 'createdAt'"),
    ([record(duration_ms=-5)], "field 'duration_ms'"),
    ([record(editedShownFirst="yes")], "field 'editedShownFirst'"),
    ([record(userId="")], "field 'userId'"),
])
def test_bad_files_refused_naming_record_and_field(tmp_path: Path, records: Any,
                                                    message: str) -> None:
    with pytest.raises(InputDataError, match=message):
        import_survey(export(tmp_path, records))


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match="does not exist"):
        import_survey(tmp_path / "nothing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(InputDataError, match="not valid JSON"):
        import_survey(broken)
