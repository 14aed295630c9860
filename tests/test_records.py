from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from acrb.errors import InputDataError
from acrb.records import (
    MIGRATIONS,
    GenerationRecord,
    JudgementRecord,
    SourceRecord,
    arrow_schema,
    read_record,
    read_records,
    read_table,
    request_id_for,
    write_record,
    write_table,
)

REQUEST = dict(model_key="synthetic:biased", model_revision="planted-abc", settings={"steps": 2},
               source_sha256="0" * 64, prompt_text="Make this person a doctor.", seed=0,
               arm="none")


def _source(i: int) -> SourceRecord:
    return SourceRecord(source_id=f"s{i}", path=f"data/sources/images/s{i}.png", sha256="f" * 64,
                        race="Black", gender="Female", age="20s", dataset="test",
                        origin=f"row {i}", width=64, height=64)


def test_request_id_is_a_stable_content_hash() -> None:
    first = request_id_for(**REQUEST)
    assert first == request_id_for(**dict(REQUEST))
    # A golden value: changing the hashing scheme silently would orphan every cached output.
    assert first == "e4f13b14113113adc235"
    for field, other in [("model_revision", "planted-xyz"), ("settings", {"steps": 3}),
                         ("source_sha256", "1" * 64), ("prompt_text", "Make them a nurse."),
                         ("seed", 1), ("arm", "debias"), ("model_key", "synthetic:fair")]:
        assert request_id_for(**{**REQUEST, field: other}) != first, field


def test_round_trip_with_schema_metadata(tmp_path: Path) -> None:
    path = tmp_path / "sources.parquet"
    assert write_table(path, [_source(0), _source(1)], SourceRecord) == 2
    frame = read_table(path, SourceRecord)
    assert frame["source_id"].tolist() == ["s0", "s1"]
    metadata = pq.read_schema(path).metadata
    assert metadata[b"acrb.table"] == b"source"
    assert metadata[b"acrb.schema_version"] == str(SourceRecord.version).encode()


def test_nullable_fields_round_trip(tmp_path: Path) -> None:
    record = JudgementRecord(request_id="r1", model="m", status="error", image_sha256=None,
                             evaluator="e", hard_refusal=None, erasure=None, lightening=None)
    path = tmp_path / "j.parquet"
    write_table(path, [record], JudgementRecord)
    frame = read_table(path, JudgementRecord)
    assert frame["hard_refusal"].isna().all()
    assert arrow_schema(JudgementRecord).field("hard_refusal").nullable


def test_invalid_row_is_refused_on_write(tmp_path: Path) -> None:
    row = _source(0).model_dump() | {"width": "wide"}
    with pytest.raises(InputDataError, match="width"):
        write_table(tmp_path / "x.parquet", [row], SourceRecord)
    assert not (tmp_path / "x.parquet").exists()


def test_unknown_status_is_refused(tmp_path: Path) -> None:
    row = dict(request_id="r", model="m", status="maybe", model_revision="x",
               library_versions="{}")
    with pytest.raises(InputDataError, match="status"):
        write_table(tmp_path / "g.parquet", [row], GenerationRecord)


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match="duplicate source_id"):
        write_table(tmp_path / "s.parquet", [_source(0), _source(0)], SourceRecord)


def test_other_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.parquet"
    schema = arrow_schema(SourceRecord).with_metadata(
        {b"acrb.table": b"source", b"acrb.schema_version": b"0"})
    pq.write_table(pa.Table.from_pylist([_source(0).model_dump()], schema=schema), path)
    with pytest.raises(InputDataError, match="schema version 0"):
        read_table(path, SourceRecord)


def test_wrong_table_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.parquet"
    write_table(path, [_source(0)], SourceRecord)
    with pytest.raises(InputDataError, match="holds a 'source' table"):
        read_table(path, GenerationRecord)


def test_truncated_parquet_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.parquet"
    write_table(path, [_source(0)], SourceRecord)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(InputDataError, match=str(path)):
        read_table(path, SourceRecord)


class SourceRecordV4(SourceRecord):
    """The source record two versions on: v3 renamed `origin` to `provenance`, v4 added `crop`."""

    version: ClassVar[int] = 4
    provenance: str
    crop: str
    origin: str = ""


def _register_source_v3_v4(monkeypatch: pytest.MonkeyPatch) -> None:
    def rename_origin(row: dict) -> dict:
        row["provenance"] = row.pop("origin")
        return row

    monkeypatch.setitem(MIGRATIONS, ("source", 2), rename_origin)
    # Runs after rename_origin: it reads the field that step wrote.
    monkeypatch.setitem(MIGRATIONS, ("source", 3),
                        lambda row: {**row, "crop": f"centre ({row['provenance']})"})


def test_older_table_is_migrated_on_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sources.parquet"
    write_table(path, [_source(0), _source(1)], SourceRecord)
    _register_source_v3_v4(monkeypatch)
    frame = read_table(path, SourceRecordV4)
    assert frame["provenance"].tolist() == ["row 0", "row 1"]
    assert frame["crop"].tolist() == ["centre (row 0)", "centre (row 1)"]
    assert frame["origin"].tolist() == ["", ""]
    assert frame["source_id"].tolist() == ["s0", "s1"]


def test_table_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sources.parquet"
    schema = arrow_schema(SourceRecord).with_metadata(
        {b"acrb.table": b"source", b"acrb.schema_version": b"9"})
    pq.write_table(pa.Table.from_pylist([_source(0).model_dump()], schema=schema), path)
    with pytest.raises(InputDataError, match=r"schema version 9 .* by a newer ACRB"):
        read_table(path, SourceRecord)


def test_record_round_trip_is_stamped(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    record = GenerationRecord(request_id="r", model="m", status="refused", refusal_kind="policy",
                              model_revision="x", library_versions="{}")
    write_record(path, record)
    stored = json.loads(path.read_text())
    assert stored["acrb_table"] == "generation"
    assert stored["acrb_schema_version"] == GenerationRecord.version
    assert read_record(path, GenerationRecord) == record


def test_older_record_is_migrated_through_the_chain(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.json"
    write_record(path, _source(3))
    _register_source_v3_v4(monkeypatch)
    migrated = read_record(path, SourceRecordV4)
    assert (migrated.provenance, migrated.crop) == ("row 3", "centre (row 3)")
    assert json.loads(path.read_text())["acrb_schema_version"] == 2  # the file is left alone


def test_unreadable_records_are_reported_together(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.json" for i in range(5)]
    for path in paths:
        write_record(path, _source(0))
    paths[0].write_text("{not json")
    paths[1].write_text(json.dumps({"acrb_table": "judgement", "acrb_schema_version": 2}))
    for path in paths[2:]:
        data = json.loads(path.read_text())
        del data["acrb_schema_version"], data["sha256"]  # unstamped: read as version 2
        path.write_text(json.dumps(data))
    with pytest.raises(InputDataError) as err:
        read_records([*paths, tmp_path / "missing.json"], SourceRecord)
    message = str(err.value)
    assert message.startswith("5 source record(s) cannot be read as version 2: ")
    assert f"{paths[0]} (not JSON" in message
    assert f"{paths[1]} (holds a 'judgement' record" in message
    assert f"{paths[2]} (field 'sha256': Field required)" in message
    assert "and 2 more" in message and str(paths[3]) not in message


def test_missing_records_are_left_out_and_a_missing_single_record_is_named(
        tmp_path: Path) -> None:
    assert read_records([tmp_path / "none.json"], SourceRecord) == {}
    with pytest.raises(InputDataError, match=r"none\.json does not exist"):
        read_record(tmp_path / "none.json", SourceRecord)
