"""Import of a survey export (acrb.review.survey) on files of the export's shape made here:
the mapping to review items and ratings, the declared scales (acrb.review.scales: the bipolar
age item is never read as drift), extra keys kept as metadata, pseudonymous raters, and the
refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from acrb.analysis.agreement.raters import rater_agreement
from acrb.errors import InputDataError
from acrb.records import VERSION_METADATA_KEY, RatingRecord, ReviewItemRecord, read_table
from acrb.review.scales import SURVEY_SCALES, load_scales
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
    row.update({f"edited_{name}": value for name, value in zip(SCORES, (2, 4, 1, 1, 3),
                                                                strict=True)})
    if preserved:
        row.update({f"preserved_{name}": value for name, value in zip(SCORES, (5, 3, 1, 1, 4),
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
            edited["age_change"], edited["age_direction"]) == (2, 4, 1, 1, 3)
    # The survey's age 4 ("older") is a drift of one step: age_change 3, direction 4 (older).
    assert (feature["edit_success"], feature["skin_tone"], feature["age_change"],
            feature["age_direction"]) == (5, 3, 3, 4)
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
    table = rater_agreement(ratings, items, axes=("edit_success",), arms=("edited",),
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
    ([record(), record("bo", createdAt="__Timestamp__soon")], "record 1, field 'createdAt'"),
    ([record(createdAt={"_seconds": "x"})], "record 0, field 'createdAt'"),
    ([record(), record("bo", edited_smile=3)],
     "record 1, field 'edited_smile'.*'smile' has no declared scale"),
    ([record(preserved_age_drift=6)], "record 0, field 'preserved_age_drift'.*outside 1-5"),
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


# --------------------------------------------------------------------------------------------
# The export as the study published it


RACES = ("White", "Black", "EastAsian", "SoutheastAsian", "Indian", "MiddleEastern", "Latino")
AGES = ("20s", "30s", "40s", "50s", "60s", "70plus")
#: Ratings per item: 20 items x 3, 20 x 4, 7 x 5, 3 x 6 = 193 records over 50 items.
PER_ITEM = [3] * 20 + [4] * 20 + [5] * 7 + [6] * 3
RATERS = [f"rater{n}@example.org" for n in range(6)]


def published_export() -> list[dict[str, Any]]:
    """193 records of the published export's shape: 50 items, 6 raters, 3-6 ratings per item,
    both outputs, every key the study's survey writes (Firebase's ``__Timestamp__`` times,
    nulls for cannot tell), and keys ACRB does not read (taskId, the e-mail, Firebase's
    evalId, Prolific ids, image URLs)."""
    records = []
    for i, count in enumerate(PER_ITEM):
        race, gender, age = RACES[i % 7], ("Male", "Female")[i % 2], AGES[i % 6]
        model = ("flux", "qwen", "step1x")[i % 3]
        prompt = f"B{i % 10 + 1:02d}"
        for k in range(count):
            user = RATERS[(i + k) % 6]
            uid = f"uid{(i + k) % 6}XyZ"
            n = len(records)
            age_answer = (3, 3, 3, 3, 3, 3, 3, 3, 4, 2, 5, 1)[n % 12]
            records.append({
                "evalId": f"{uid}_amt_{i:04d}",
                "itemId": f"amt_{i:04d}",
                "originalItemId": f"{race}_{gender}_{age}",
                "taskId": 1 + i // 10,
                "userId": uid,
                "userEmail": user,
                "model": model, "promptId": prompt, "category": "B",
                "categoryName": "B_occupation",
                "race": race, "gender": gender, "age": age,
                "sourceImageUrl": f"images/source/{race}_{gender}_{age}.jpg",
                "editedImageUrl": f"images/{model}/{prompt}_{race}_{gender}_{age}_success.png",
                "preservedImageUrl": f"images/{model}/{prompt}_{race}_{gender}_{age}_p.png",
                "edited_edit_success": 1 + n % 5,
                "edited_skin_tone": None if n % 17 == 0 else 3 + (n % 3 == 0),
                "edited_race_drift": 1 + (n % 7 == 0),
                "edited_gender_drift": 1,
                "edited_age_drift": age_answer,
                "preserved_edit_success": 1 + (n + 2) % 5,
                "preserved_skin_tone": 3,
                "preserved_race_drift": 1,
                "preserved_gender_drift": None if n % 23 == 0 else 1,
                "preserved_age_drift": 3,
                "editedShownFirst": (i * 7) % 2 == 0,
                "duration_ms": 4000 + 37 * n,
                "createdAt": f"__Timestamp__2026-01-19T17:{n % 60:02d}:54.489Z",
                "experimentType": "amt_unified", "version": "1.0",
                "prolificPid": f"pid-{(i + k) % 6}", "prolificStudyId": "study-1",
                "prolificSessionId": None,
            })
    return records


def test_the_published_export_imports(tmp_path: Path) -> None:
    records = published_export()
    assert len(records) == 193
    path = export(tmp_path, records)
    written = write_survey(path, tmp_path / "out")
    items = read_table(written["items"], ReviewItemRecord)
    ratings = read_table(written["ratings"], RatingRecord)
    assert len(items) == 50 and len(ratings) == 386 and ratings["rater"].nunique() == 6
    per_item = ratings[ratings["output"] == "edited"].groupby("item_id")["rater"].nunique()
    assert (per_item.min(), per_item.max()) == (3, 6)
    assert set(items["model"]) == {"flux", "qwen", "step1x"}
    assert set(items["race"]) == set(RACES)
    first = ratings.sort_values("created_at").iloc[0]
    assert first["created_at"] == "2026-01-19T17:00:54.489000Z"
    # The age item is bipolar: its many "same" answers (3) are no drift at all.
    edited = ratings[ratings["output"] == "edited"]
    assert (edited["age_change"] > 1).sum() == sum(
        r["edited_age_drift"] != 3 for r in records)
    assert set(edited["age_direction"]) == {1, 2, 3, 4, 5}
    assert edited["skin_tone"].isna().sum() == sum(r["edited_skin_tone"] is None
                                                   for r in records)
    # Extra keys are kept; what identifies a person only as a keyed hash.
    meta = json.loads(ratings["metadata"].iloc[0])
    assert {"taskId", "categoryName", "editedImageUrl", "experimentType", "version",
            "prolificStudyId", "evalId", "userEmail", "prolificPid"} <= set(meta)
    assert meta["userEmail"].startswith("hmac-") and meta["prolificPid"].startswith("hmac-")
    assert meta["evalId"].startswith("survey-") and meta["prolificSessionId"] is None
    item_meta = json.loads(items["metadata"].iloc[0])
    assert item_meta == {"category": "B", "survey_model": items["model"].iloc[0]}
    for file in written.values():
        data = file.read_bytes()
        assert b"example.org" not in data and b"XyZ" not in data and b"pid-" not in data


@pytest.mark.parametrize(("answer", "change", "direction"), [
    (1, 5, 1), (2, 3, 2), (3, 1, 3), (4, 3, 4), (5, 5, 5), (None, None, None)])
def test_bipolar_age_is_direction_and_drift_never_raw_drift(
        tmp_path: Path, answer: int | None, change: int | None, direction: int | None) -> None:
    ratings = import_survey(export(tmp_path, [record(edited_age_drift=answer)]))[1]
    edited = ratings[ratings["output"] == "edited"].iloc[0]
    if change is None:
        assert pd.isna(edited["age_change"]) and pd.isna(edited["age_direction"])
    else:
        assert (edited["age_change"], edited["age_direction"]) == (change, direction)


def test_scales_can_be_declared_for_another_export(tmp_path: Path) -> None:
    scales = tmp_path / "scales.yaml"
    scales.write_text(
        "axes:\n"
        "  edit_success: {scale: success, axis: edit_success}\n"
        "  skin_tone: {scale: bipolar-skin, axis: skin_tone}\n"
        "  race_drift: {scale: unipolar-change, axis: race_change}\n"
        "  gender_drift: {scale: ignore}\n"
        "  age_drift: {scale: unipolar-change, axis: age_change}\n")
    ratings = import_survey(export(tmp_path, [record(edited_age_drift=2)]), scales)[1]
    edited = ratings[ratings["output"] == "edited"].iloc[0]
    assert edited["age_change"] == 2 and pd.isna(edited["age_direction"])
    assert pd.isna(edited["gender_change"])  # ignored: kept as metadata only
    assert json.loads(edited["metadata"])["edited_gender_drift"] == 1
    drift = tmp_path / "drift.yaml"
    drift.write_text(scales.read_text().replace("{scale: unipolar-change, axis: age_change}",
                                                "{scale: bipolar-age, axis: age_change}")
                     + "age_drift: {0: 1, 1: 2, 2: 4}\n")
    ratings = import_survey(export(tmp_path, [record(edited_age_drift=1)], "b.json"), drift)[1]
    assert ratings.loc[ratings["output"] == "edited", "age_change"].iloc[0] == 4


@pytest.mark.parametrize(("text", "message"), [
    ("axes:\n  skin_tone: {scale: unipolar-change, axis: skin_tone}\n",
     "survey axis 'skin_tone' is on the 'unipolar-change' scale.*cannot map onto 'skin_tone'"),
    ("axes:\n  age_drift: {scale: bipolar-age, axis: race_change}\n",
     "survey axis 'age_drift'.*cannot map onto 'race_change'"),
    ("axes:\n  x: {scale: success, axis: smile}\n", "'x' is read as 'smile'"),
    ("axes:\n  x: {scale: likert, axis: edit_success}\n", "entry 'axes.x.scale'"),
    ("axes:\n  a: {scale: success, axis: edit_success}\n"
     "  b: {scale: success, axis: edit_success}\n", "'a' and 'b' are both read as"),
    ("axes: {}\nage_drift: {0: 2, 1: 3, 2: 5}\n", "entry 'age_drift'"),
])
def test_scales_acrb_cannot_map_are_refused_naming_the_axis(tmp_path: Path, text: str,
                                                              message: str) -> None:
    path = tmp_path / "scales.yaml"
    path.write_text(text)
    with pytest.raises(InputDataError, match=message):
        load_scales(path)


def test_an_axis_without_a_declared_scale_is_refused(tmp_path: Path) -> None:
    path = export(tmp_path, [record()])
    assert set(SURVEY_SCALES.axes) == set(SCORES)
    partial = tmp_path / "scales.yaml"
    partial.write_text("axes:\n  edit_success: {scale: success, axis: edit_success}\n")
    with pytest.raises(InputDataError, match=r"record 0, field 'edited_skin_tone'.*no declared"):
        import_survey(path, partial)


def test_created_at_forms(tmp_path: Path) -> None:
    rows = [record("a", createdAt="__Timestamp__2026-01-19T17:59:54.489Z"),
            record("b", createdAt="2026-01-19T17:59:54Z"),
            record("c", createdAt=1_768_845_594_000),
            record("d", createdAt={"_seconds": 1_768_845_594, "_nanoseconds": 0})]
    ratings = import_survey(export(tmp_path, rows))[1]
    times = ratings.drop_duplicates("rater")["created_at"].tolist()
    assert times[0] == "2026-01-19T17:59:54.489000Z"
    assert times[1:] == ["2026-01-19T17:59:54Z"] * 3


def test_tables_written_before_version_3_are_migrated(tmp_path: Path) -> None:
    """Ratings and items of version 2 (no age direction, no metadata) read as version 3."""
    written = write_survey(export(tmp_path, [record(), record("bo@example.org")]),
                           tmp_path / "out")
    for name, record_type, dropped in (("ratings", RatingRecord, ["age_direction", "metadata"]),
                                       ("items", ReviewItemRecord, ["metadata"])):
        table = pq.read_table(written[name]).drop_columns(dropped)
        meta = dict(table.schema.metadata)
        meta[VERSION_METADATA_KEY] = b"2"
        pq.write_table(table.replace_schema_metadata(meta), written[name])
        old = read_table(written[name], record_type)
        assert (old["metadata"] == "").all()
    ratings = read_table(written["ratings"], RatingRecord)
    assert ratings["age_direction"].isna().all() and ratings["age_change"].notna().all()


def test_import_survey_command_takes_a_scales_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from acrb.cli import app

    path = export(tmp_path, [record(), record("bo@example.org")])
    scales = tmp_path / "scales.yaml"
    scales.write_text("axes:\n  skin_tone: {scale: unipolar-change, axis: skin_tone}\n")
    runner = CliRunner()
    refused = runner.invoke(app, ["review", "import-survey", str(path), "--out",
                                  str(tmp_path / "out"), "--scales", str(scales)])
    assert refused.exit_code != 0 and "skin_tone" in refused.output
    done = runner.invoke(app, ["review", "import-survey", str(path), "--out",
                               str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    ratings = read_table(tmp_path / "out" / "ratings.parquet", RatingRecord)
    assert (ratings.loc[ratings["output"] == "edited", "age_change"] == 1).all()


# --------------------------------------------------------------------------------------------
# What JSON cannot read, repeated keys, and the outputs replaced as one set


@pytest.mark.parametrize(("text", "message"), [
    ('[{"userId": ' + "9" * 5000 + "}]", "a number of 5,000 digits, more than the 4,300"),
    ("[" * 50_000 + "]" * 50_000, r"arrays and objects nested too deeply \(50,000 levels"),
], ids=["huge-number", "deep-nesting"])
def test_what_json_cannot_read_is_refused_naming_the_file(tmp_path: Path, text: str,
                                                          message: str) -> None:
    path = tmp_path / "survey.json"
    path.write_text(text)
    with pytest.raises(InputDataError, match=f"survey export {path} cannot be read: it holds "
                       + message):
        import_survey(path)


def test_a_key_repeated_in_a_record_is_refused_naming_record_and_key(tmp_path: Path) -> None:
    path = tmp_path / "survey.json"
    text = json.dumps([record(), record("bo@example.org")])
    # The second record rates edit success twice: JSON would keep only the 5.
    at = text.rindex('"edited_edit_success": 2')
    path.write_text(text[:at] + '"edited_edit_success": 1, ' + text[at:].replace(": 2", ": 5", 1))
    with pytest.raises(InputDataError, match=r"survey\.json: record 1, field "
                       r"'edited_edit_success': key 'edited_edit_success' appears twice in the "
                       r"record \(JSON would keep only the last\)"):
        import_survey(path)
    nested = [record(taskId={"round": 1}), record("bo@example.org")]
    path.write_text(json.dumps(nested).replace('{"round": 1}', '{"round": 1, "round": 2}'))
    with pytest.raises(InputDataError, match=r"record 0, field 'taskId': key 'round' appears "
                       "twice in this object"):
        import_survey(path)


@pytest.mark.parametrize("duration", [1e300, 2**63, 9.3e18])
def test_a_duration_no_table_holds_is_refused_naming_the_record(tmp_path: Path,
                                                                 duration: float) -> None:
    with pytest.raises(InputDataError, match=r"record 1, field 'duration_ms': .* milliseconds "
                       r"is more than a table holds"):
        import_survey(export(tmp_path, [record(), record("bo@example.org",
                                                         duration_ms=duration)]))
    largest = import_survey(export(tmp_path, [record(duration_ms=2**63 - 1)]))[1]
    assert largest["duration_ms"].tolist() == [2**63 - 1] * 2


def _outputs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_bad_record_keeps_the_previous_outputs(tmp_path: Path) -> None:
    """A value refused in the last record: nothing of the new import is written."""
    out = tmp_path / "out"
    write_survey(export(tmp_path, [record()], "first.json"), out)
    before = _outputs(out)
    bad = export(tmp_path, [record("bo@example.org", "it-9"),
                            record("cy@example.org", duration_ms=1e300)], "second.json")
    with pytest.raises(InputDataError, match="record 1, field 'duration_ms'"):
        write_survey(bad, out)
    assert _outputs(out) == before


@pytest.mark.parametrize("failing", ["ratings", "ratings_csv"])
def test_a_failed_write_keeps_the_previous_outputs_as_a_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """A full disk while the second or third output is written: the outputs already written
    for the new import are not put in place beside the old ones."""
    import errno

    from acrb.review import survey
    from acrb.storage import TMP_PREFIX

    out = tmp_path / "out"
    write_survey(export(tmp_path, [record()], "first.json"), out)
    before = _outputs(out)

    def full_disk(*args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    if failing == "ratings":
        write_table = survey.write_table
        monkeypatch.setattr(survey, "write_table", lambda path, rows, record_type: (
            full_disk() if record_type is RatingRecord else write_table(path, rows, record_type)))
    else:
        monkeypatch.setattr(survey, "write_csv", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_survey(export(tmp_path, [record("bo@example.org", "it-9")], "second.json"), out)
    monkeypatch.undo()
    assert _outputs(out) == before
    assert not [p for p in out.iterdir() if p.name.startswith(TMP_PREFIX)]
