from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from acrb.errors import InputDataError
from acrb.records import (
    SCHEMA_VERSION,
    GenerationRecord,
    JudgementRecord,
    SourceRecord,
    arrow_schema,
    read_table,
    request_id_for,
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
    assert metadata[b"acrb.schema_version"] == str(SCHEMA_VERSION).encode()


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
    row = dict(request_id="r", model="m", status="maybe", seconds=0.1, model_revision="x",
               library_versions="{}", created_at="now")
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
