"""The study's published feature mapping (``identity_prompt_mapping.json``), imported: one
JSON object of 84 design-cell keys, made here with invented sentences, matched to the sources
of a run by source id or, for sources not named by cell (the placeholder portraits), by the
cell of their labels."""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from acrb import layout
from acrb.demographics import AGES, GENDERS, RACES
from acrb.errors import InputDataError
from acrb.features.mapping import cell_key, read_mapping
from acrb.records import FeaturePromptRecord, SourceRecord, migrate, read_table
from acrb.sources.fairface import LABELS
from acrb.stages import features, sources
from tests.conftest import update_params

#: The published file's key vocabulary, as the study spells it.
STUDY_RACES = ("White", "Black", "EastAsian", "SoutheastAsian", "Indian", "MiddleEastern",
               "Latino")
STUDY_GENDERS = ("Male", "Female")
STUDY_AGES = ("20s", "30s", "40s", "50s", "60s", "70plus")
CELLS = [f"{r}_{g}_{a}" for r, g, a in product(STUDY_RACES, STUDY_GENDERS, STUDY_AGES)]
#: Two of the invented sentences name a group, as 15 of the published 84 do.
LABELLED = {"EastAsian_Female_30s": "east asian", "Indian_Male_60s": "ethnic"}


def sentence(cell: str) -> str:
    """An invented sentence in the published form ("Maintain the person's ...")."""
    if cell == "EastAsian_Female_30s":
        return "Maintain the person's East Asian eye shape and soft jawline."
    if cell == "Indian_Male_60s":
        return "Maintain the person's ethnic features and   grey  beard."
    return f"Maintain the person's made-up trait number {CELLS.index(cell)} and their hair."


def write_mapping(path: Path, keys: list[str] | None = None,
                  extra: dict[str, str] | None = None) -> Path:
    """The published shape: one object, cell keys in the published order, one sentence each."""
    document = {key: sentence(key) for key in (CELLS if keys is None else keys)}
    document.update(extra or {})
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def source(source_id: str, race: str, gender: str, age: str) -> SourceRecord:
    return SourceRecord(source_id=source_id, path=f"{source_id}.png", sha256="0" * 64,
                        race=race, gender=gender, age=age, dataset="test", origin=source_id,
                        width=64, height=64)


def test_the_study_spells_the_cells_as_acrb_does() -> None:
    assert set(STUDY_RACES) == set(RACES) and set(STUDY_GENDERS) == set(GENDERS)
    assert set(STUDY_AGES) == set(AGES)
    # FairFace's labels map onto those spellings, so curated sources are named by these cells.
    assert set(LABELS["race"].values()) == set(STUDY_RACES)
    assert {a for a in LABELS["age"].values() if a} == set(STUDY_AGES)
    assert len(set(CELLS)) == 84
    assert cell_key(source("syn-White-Male-20s-0", "White", "Male", "20s")) == "White_Male_20s"


def test_placeholder_sources_get_the_prompt_of_their_cell(tmp_path: Path) -> None:
    path = write_mapping(tmp_path / "identity_prompt_mapping.json")
    run = [source("syn-White-Male-20s-0", "White", "Male", "20s"),
           source("syn-White-Male-20s-1", "White", "Male", "20s"),
           source("syn-Indian-Male-60s-0", "Indian", "Male", "60s")]
    imported = read_mapping(path, run)
    rows = {r.source_id: r for r in imported.records}
    assert list(rows) == [s.source_id for s in run]
    assert {r.matched_by for r in rows.values()} == {"cell"}
    assert rows["syn-White-Male-20s-1"].mapping_key == "White_Male_20s"
    assert rows["syn-White-Male-20s-0"].text == rows["syn-White-Male-20s-1"].text == sentence(
        "White_Male_20s")
    # The published sentence, whitespace normalised, and nothing else: no label is added.
    assert rows["syn-Indian-Male-60s-0"].text == (
        "Maintain the person's ethnic features and grey beard.")
    assert imported.labelled == {"syn-Indian-Male-60s-0": ["ethnic"]}  # a warning, not refused
    assert imported.matched == {"cell": 3}
    assert imported.extra_ids == 82  # the cells this run has no source of are allowed
    assert all(r.origin == "mapping" and r.describer == imported.describer
               and r.source_sha256 == "" for r in rows.values())


def test_a_source_named_by_a_key_matches_by_source_id_first(tmp_path: Path) -> None:
    path = write_mapping(tmp_path / "mapping.json",
                         extra={"portrait-17": "Maintain the person's freckles.",
                                "not-a-cell-or-source": "Maintain something."})
    run = [source("White_Female_70plus", "White", "Female", "70plus"),
           source("portrait-17", "Black", "Female", "20s"),  # its own key wins over its cell
           source("syn-Latino-Female-40s-0", "Latino", "Female", "40s")]
    imported = read_mapping(path, run)
    got = {r.source_id: (r.matched_by, r.mapping_key, r.text) for r in imported.records}
    assert got == {
        "White_Female_70plus": ("source_id", "White_Female_70plus",
                                sentence("White_Female_70plus")),
        "portrait-17": ("source_id", "portrait-17", "Maintain the person's freckles."),
        "syn-Latino-Female-40s-0": ("cell", "Latino_Female_40s", sentence("Latino_Female_40s")),
    }
    assert imported.matched == {"source_id": 2, "cell": 1}
    assert imported.extra_ids == 86 - 3  # 84 cells + 2 other keys, less the three keys used


def test_a_source_whose_cell_is_missing_is_named_with_the_key_expected(tmp_path: Path) -> None:
    path = write_mapping(tmp_path / "mapping.json",
                         [c for c in CELLS if c not in ("Indian_Female_60s", "Black_Male_20s")])
    run = [source("syn-White-Male-20s-0", "White", "Male", "20s"),
           source("syn-Indian-Female-60s-0", "Indian", "Female", "60s"),
           source("Black_Male_20s", "Black", "Male", "20s")]
    with pytest.raises(InputDataError) as error:
        read_mapping(path, run)
    assert ("no feature prompt for 2 of this run's 3 sources, by source id or by cell key: "
            "syn-Indian-Female-60s-0 (cell Indian_Female_60s), Black_Male_20s") \
        in error.value.problem
    assert "Race>_<Gender>_<Age>" in error.value.fix


@pytest.mark.parametrize(("damage", "message"), [
    (lambda text: text.replace('"White_Male_20s": ', '"White_Male_20s": ' + "1" * 5000 + ', "x": ',
                               1),
     r"a number of 5,000 digits at line 2, more than the 4,300 Python reads"),
    (lambda text: text.replace('"White_Male_20s": ',
                               '"x": ' + "[" * 50_000 + "]" * 50_000 + ', "White_Male_20s": ', 1),
     r"arrays and objects nested too deeply at line 2 \(50,001 levels"),
], ids=["huge-number", "deep-nesting"])
def test_what_json_cannot_read_is_refused_naming_the_file(tmp_path: Path, damage: Any,
                                                          message: str) -> None:
    path = write_mapping(tmp_path / "mapping.json")
    path.write_text(damage(path.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(InputDataError, match=f"feature mapping {path} cannot be read: it holds "
                       + message):
        read_mapping(path, [source("syn-White-Male-20s-0", "White", "Male", "20s")])


def test_the_stage_maps_all_84_placeholder_cells(project: Path) -> None:
    """The stand-in placeholder portraits of every cell get the study's sentences by cell; the
    group-naming sentences are listed as warnings in summary.json."""
    (project / "inputs").mkdir()
    write_mapping(project / "inputs" / "identity_prompt_mapping.json")
    ctx = update_params(project, lambda p: (
        p["sources"].update(races=list(RACES), genders=list(GENDERS), ages=list(AGES),
                            resolution=32),
        p.update(features={"describer": "mapping",
                           "mapping": "inputs/identity_prompt_mapping.json"})))
    sources.run(ctx)
    summary = features.run(ctx)
    assert summary.count == 84 and summary.matched == {"cell": 84} and summary.extra_ids == 0
    table = read_table(project / layout.FEATURES_TABLE, FeaturePromptRecord)
    source_table = read_table(project / layout.SOURCES_TABLE, SourceRecord).set_index(
        "source_id")
    assert sorted(table["source_id"]) == sorted(source_table.index)
    assert set(table["matched_by"]) == {"cell"}
    for row in table.itertuples():
        labels = source_table.loc[row.source_id]
        cell = f"{labels['race']}_{labels['gender']}_{labels['age']}"
        assert row.mapping_key == cell
        assert row.text == " ".join(sentence(cell).split())
    written = json.loads((project / layout.FEATURES_DIR / "summary.json").read_text())
    assert written["mapping_matched"] == {"cell": 84}
    assert {w["source_id"]: w["labels"] for w in written["label_warnings"]} == {
        f"syn-{cell.replace('_', '-')}-0": [label] for cell, label in LABELLED.items()}


def test_old_feature_prompt_rows_say_a_mapping_matched_by_source_id() -> None:
    row = {"source_id": "White_Male_20s", "source_sha256": "", "text": "t", "dimensions": "{}",
           "origin": "mapping", "describer": "m.json@ab", "attempts": 0, "rejected": ""}
    migrated = migrate(row, FeaturePromptRecord, 2)
    assert (migrated["matched_by"], migrated["mapping_key"]) == ("source_id", "White_Male_20s")
    FeaturePromptRecord.model_validate(migrated)
    described = migrate({**row, "origin": "vlm"}, FeaturePromptRecord, 2)
    assert (described["matched_by"], described["mapping_key"]) == ("", "")
