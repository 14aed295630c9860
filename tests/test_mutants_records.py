"""Kill tests for the record migration chain of acrb.records, called in this process.

tests/test_record_migrations.py checks the chain through the generate and evaluate stages on a
built project; here :func:`migrate`, a Parquet table of an older version read through
:func:`read_table` (the row-by-row migration of ``_migrated_table``) and
:func:`upgrade_records` are called directly on a small record type whose migrations the test
sets, so each step, each refusal and each message is pinned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from acrb.errors import InputDataError
from acrb.records import (
    MIGRATIONS,
    RECORD_TABLE_FIELD,
    RECORD_VERSION_FIELD,
    Record,
    UnreadableRecordError,
    migrate,
    read_table,
    upgrade_records,
    write_record,
    write_table,
)


class TinyV2(Record):
    """A record as version 2 stored it."""

    table: ClassVar[str] = "tiny"
    key: ClassVar[str] = "id"
    version: ClassVar[int] = 2
    id: str
    n: int


class TinyV4(Record):
    """The same record two versions later: a label (version 3) and a score (version 4)."""

    table: ClassVar[str] = "tiny"
    key: ClassVar[str] = "id"
    version: ClassVar[int] = 4
    id: str
    n: int
    label: str
    score: float | None


class TinyV5(TinyV4):
    version: ClassVar[int] = 5


def to_v3(row: dict[str, Any]) -> dict[str, Any]:
    row["label"] = f"n={row['n']}"  # edits its argument: migrate must hand it a copy
    return row


@pytest.fixture
def chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 2 -> 3 adds the label; 3 -> 4 marks it and adds an unknown score. The order
    shows in the label: a step run twice, skipped or out of turn spells it otherwise."""
    monkeypatch.setitem(MIGRATIONS, ("tiny", 2), to_v3)
    monkeypatch.setitem(MIGRATIONS, ("tiny", 3),
                        lambda row: {**row, "label": row["label"] + ";v4", "score": None})


def test_migrate_runs_each_step_in_turn(chain: None) -> None:
    row = {"id": "a", "n": 1}
    assert migrate(row, TinyV4, 2) == {"id": "a", "n": 1, "label": "n=1;v4", "score": None}
    assert row == {"id": "a", "n": 1}  # the stored row is left as it was
    assert migrate({"id": "a", "n": 1, "label": "x"}, TinyV4, 3) == {
        "id": "a", "n": 1, "label": "x;v4", "score": None}


def test_migrate_of_the_current_version_is_the_row(chain: None) -> None:
    row = {"id": "a", "n": 1, "label": "x", "score": 0.5}
    assert migrate(row, TinyV4, 4) is row


def test_migrate_refuses_a_newer_version(chain: None) -> None:
    with pytest.raises(UnreadableRecordError) as err:
        migrate({"id": "a"}, TinyV4, 5)
    assert err.value.reason == "newer"
    assert err.value.detail == "version 5, newer than the 4 this ACRB reads"


def test_migrate_refuses_a_gap_in_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MIGRATIONS, ("tiny", 2), to_v3)
    monkeypatch.delitem(MIGRATIONS, ("tiny", 3), raising=False)
    with pytest.raises(UnreadableRecordError) as err:
        migrate({"id": "a", "n": 1}, TinyV4, 2)
    assert err.value.reason == "no_migration"
    assert err.value.detail == "version 3, and no migration from version 3"


# ---- a Parquet table of an older version ---------------------------------------------------


def test_an_older_table_is_migrated_row_by_row(chain: None, tmp_path: Path) -> None:
    path = tmp_path / "tiny.parquet"
    write_table(path, [{"id": "a", "n": 1}, {"id": "b", "n": 2}], TinyV2)
    frame = read_table(path, TinyV4)
    expected = pd.DataFrame({"id": ["a", "b"], "n": [1, 2], "label": ["n=1;v4", "n=2;v4"],
                             "score": [None, None]}).astype({"score": float})
    pd.testing.assert_frame_equal(frame, expected)


def stale_problem(path: Path, found: str) -> str:
    return (f"{path} was written with schema version {found}; this ACRB reads version 4 of "
            "the 'tiny' table")


STALE_FIX = ("re-run the stage that writes it with this version of ACRB (`dvc repro`), or add "
             "a migration of the 'tiny' table to MIGRATIONS in acrb/records.py")


def test_a_table_of_a_version_no_migration_reaches_is_stale(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(MIGRATIONS, ("tiny", 2), to_v3)
    monkeypatch.delitem(MIGRATIONS, ("tiny", 3), raising=False)
    path = tmp_path / "tiny.parquet"
    write_table(path, [{"id": "a", "n": 1}], TinyV2)
    with pytest.raises(InputDataError) as err:
        read_table(path, TinyV4)
    assert (err.value.problem, err.value.fix) == (stale_problem(path, "2"), STALE_FIX)


def test_a_table_whose_version_is_not_a_number_is_stale(chain: None, tmp_path: Path) -> None:
    path = tmp_path / "tiny.parquet"
    table = pa.table({"id": ["a"], "n": [1]}).replace_schema_metadata(
        {b"acrb.table": b"tiny", b"acrb.schema_version": b"two"})
    pq.write_table(table, path)
    with pytest.raises(InputDataError) as err:
        read_table(path, TinyV4)
    assert (err.value.problem, err.value.fix) == (stale_problem(path, "two"), STALE_FIX)


def test_a_table_of_a_newer_version_asks_for_an_upgrade(chain: None, tmp_path: Path) -> None:
    path = tmp_path / "tiny.parquet"
    write_table(path, [{"id": "a", "n": 1, "label": "x", "score": 1.0}], TinyV5)
    with pytest.raises(InputDataError) as err:
        read_table(path, TinyV4)
    assert err.value.problem == (f"{path} was written with schema version 5 of the 'tiny' table "
                                 "by a newer ACRB; this ACRB reads version 4")
    assert err.value.fix == "upgrade ACRB, or re-run the stage that writes it with this version"


def test_a_migration_that_gives_an_invalid_row_names_the_table(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(MIGRATIONS, ("tiny", 2), to_v3)
    monkeypatch.setitem(MIGRATIONS, ("tiny", 3), lambda row: {**row, "score": "high"})
    path = tmp_path / "tiny.parquet"
    write_table(path, [{"id": "a", "n": 1}], TinyV2)
    with pytest.raises(InputDataError) as err:
        read_table(path, TinyV4)
    assert err.value.problem.startswith(
        f"{path} (migrated from schema version 2): row 0, field 'score': ")


# ---- upgrade_records -----------------------------------------------------------------------


def stored(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_upgrade_rewrites_older_records_and_hands_over_what_they_held(
        chain: None, tmp_path: Path) -> None:
    old, unstamped, current, newer = (tmp_path / f"{n}.json" for n in
                                      ("old", "unstamped", "current", "newer"))
    write_record(old, TinyV2(id="a", n=1))
    unstamped.write_text(json.dumps({"id": "b", "n": 2}))  # before stamps: version 2
    write_record(current, TinyV4(id="c", n=3, label="kept", score=0.5))
    write_record(newer, TinyV5(id="d", n=4, label="later", score=None))
    untouched = {p: p.read_bytes() for p in (current, newer)}
    seen: list[dict[Path, dict[str, Any]]] = []

    def keep(rows: dict[Path, dict[str, Any]]) -> None:
        # Called before any file is rewritten.
        assert stored(old)[RECORD_VERSION_FIELD] == 2
        seen.append(rows)

    paths = [old, tmp_path / "absent.json", unstamped, current, newer]
    result = upgrade_records(paths, TinyV4, keep=keep)
    assert result == {old: {"id": "a", "n": 1}, unstamped: {"id": "b", "n": 2}}
    assert seen == [result]
    assert stored(old) == {RECORD_TABLE_FIELD: "tiny", RECORD_VERSION_FIELD: 4, "id": "a",
                           "n": 1, "label": "n=1;v4", "score": None}
    assert stored(unstamped)[RECORD_VERSION_FIELD] == 4
    assert stored(unstamped)["label"] == "n=2;v4"
    assert {p: p.read_bytes() for p in (current, newer)} == untouched
    assert not (tmp_path / "absent.json").exists()


def test_upgrade_with_nothing_to_do_calls_no_keeper(chain: None, tmp_path: Path) -> None:
    current = tmp_path / "current.json"
    write_record(current, TinyV4(id="c", n=3, label="kept", score=0.5))
    calls: list[object] = []
    assert upgrade_records([current], TinyV4, keep=calls.append) == {}
    assert calls == []
    assert upgrade_records([current], TinyV4) == {}


def test_upgrade_without_a_keeper_still_rewrites(chain: None, tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    write_record(old, TinyV2(id="a", n=1))
    assert upgrade_records([old], TinyV4) == {old: {"id": "a", "n": 1}}
    assert stored(old)[RECORD_VERSION_FIELD] == 4


@pytest.mark.parametrize(("content", "detail"), [
    ("{not json", "not JSON: "),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({RECORD_VERSION_FIELD: True, "id": "x", "n": 1}),
     "version True is not a whole number"),
    (json.dumps({RECORD_VERSION_FIELD: 2, "id": "x", "n": "many"}), "field 'n'"),
])
def test_one_unreadable_record_stops_the_upgrade_before_any_rewrite(
        chain: None, tmp_path: Path, content: str, detail: str) -> None:
    good, bad = tmp_path / "a-good.json", tmp_path / "b-bad.json"
    write_record(good, TinyV2(id="a", n=1))
    bad.write_text(content)
    before = good.read_bytes()
    calls: list[object] = []
    with pytest.raises(InputDataError) as err:
        upgrade_records([good, bad], TinyV4, keep=calls.append)
    assert err.value.problem.startswith(
        f"1 tiny record(s) cannot be read as version 4: {bad} ({detail}")
    assert good.read_bytes() == before and bad.read_text() == content
    assert calls == []


def test_an_unstamped_record_of_a_type_still_at_version_two_is_current(tmp_path: Path) -> None:
    """Unstamped means version 2: for a type still at version 2 there is nothing to upgrade,
    and the file is left byte for byte."""
    unstamped = tmp_path / "unstamped.json"
    unstamped.write_text(json.dumps({"id": "b", "n": 2}))
    before = unstamped.read_bytes()
    assert upgrade_records([unstamped], TinyV2) == {}
    assert unstamped.read_bytes() == before


def test_a_current_record_before_an_older_one_does_not_end_the_upgrade(
        chain: None, tmp_path: Path) -> None:
    current, old = tmp_path / "a-current.json", tmp_path / "b-old.json"
    write_record(current, TinyV4(id="c", n=3, label="kept", score=0.5))
    write_record(old, TinyV2(id="a", n=1))
    assert upgrade_records([current, old], TinyV4) == {old: {"id": "a", "n": 1}}
    assert stored(old)[RECORD_VERSION_FIELD] == 4


def test_every_unreadable_record_is_named_with_the_fix_for_its_reason(
        chain: None, tmp_path: Path) -> None:
    """Files that are not JSON, not an object, or of a version no migration reaches: each is
    named (one bad file does not hide the next), and the fix says to add a migration (or
    delete the files)."""
    paths = [tmp_path / f"{n}.json" for n in ("a-list", "b-text", "c-gap", "d-list")]
    paths[0].write_text("[1, 2]")
    paths[1].write_text("{not json")
    paths[2].write_text(json.dumps({RECORD_VERSION_FIELD: 1, "id": "x", "n": 1}))
    paths[3].write_text("[3]")
    with pytest.raises(InputDataError) as err:
        upgrade_records(paths, TinyV4)
    assert err.value.problem.startswith("4 tiny record(s) cannot be read as version 4: ")
    assert all(str(path) in err.value.problem for path in paths[:3])
    assert err.value.problem.endswith("; and 1 more")
    assert err.value.fix is not None
    assert "add a migration of the 'tiny' record to version 4 to MIGRATIONS" in err.value.fix
    assert "delete those files" in err.value.fix
    for content in ("{not json", "[1, 2]"):  # alone, each still gets the migration fix
        paths[0].write_text(content)
        with pytest.raises(InputDataError) as alone:
            upgrade_records(paths[:1], TinyV4)
        assert alone.value.fix is not None and "to MIGRATIONS" in alone.value.fix
