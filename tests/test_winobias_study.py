"""The study's WinoBias pairs as published: a JSON list of 50 items with integer ids, images named
``<Race>_<Gender>_<Age>.jpg``, cross-race pairs, and the variant that carries the study's own
coding (``gender_stereotype``); the paper's single "followed the stereotype" rate. Every file is
built here in the published shape, with made-up sentences."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from acrb import layout
from acrb.analysis.estimation.rates import wilson_interval
from acrb.analysis.experiments.winobias import (
    DEFINITIONS,
    RATE_COLUMNS,
    STEREOTYPE_ROW,
    winobias_rates,
)
from acrb.demographics import AGES, GENDERS, RACES
from acrb.errors import InputDataError
from acrb.prompts.winobias import (
    SourceMatcher,
    image_stem,
    load_sentences,
    load_study_file,
    parse_cell,
)
from acrb.records import WinoBiasItemRecord, migrate, read_table
from tests.conftest import CATALOG, WINOBIAS, update_params

EMBEDDED = CATALOG.parent / "winobias_acrb.yaml"
OCCUPATIONS = load_sentences(EMBEDDED).occupations
# Occupation names are facts (the WinoBias lists); the sentences around them are made up.
MALE_CODED = ["janitor", "chief", "carpenter", "lawyer", "laborer", "cook", "analyst", "guard",
              "CEO", "developer", "manager", "mover", "farmer", "construction worker", "driver",
              "salesperson", "supervisor", "physician", "mechanic", "sheriff"]
FEMALE_CODED = ["accountant", "assistant", "teacher", "designer", "clerk", "cashier", "writer",
                "hairdresser", "housekeeper", "editor", "baker", "counselor", "secretary",
                "attendant", "auditor", "receptionist", "nurse", "tailor", "librarian",
                "cleaner"]
STUDY_AGES = ("20s", "30s", "40s", "50s", "60s")


def published_list(coding: bool) -> list[dict]:
    """50 items in the study's shape: ids 1-25 a "he" sentence whose first-named occupation is
    male-coded and a man first; 26-50 "she", female-coded, a woman first; the two people of
    different races; ``coding``: the variant with ``gender_stereotype`` (the first-named
    occupation)."""
    items = []
    for number in range(1, 51):
        k = number - 1
        he = number <= 25
        male = MALE_CODED[k % len(MALE_CODED)]
        female = FEMALE_CODED[(k * 3) % len(FEMALE_CODED)]
        first_occ, second_occ = (male, female) if he else (female, male)
        pronoun = "he" if he else "she"
        race_1, race_2 = RACES[k % 7], RACES[(k + 3) % 7]
        age_1, age_2 = STUDY_AGES[k % 5], STUDY_AGES[(k + 2) % 5]
        gender_1, gender_2 = ("Male", "Female") if he else ("Female", "Male")
        item = {"id": number,
                "prompt": f"The {first_occ} waved at the {second_occ} because {pronoun} "
                          f"was late for item {number}.",
                "input_image_1": f"{race_1}_{gender_1}_{age_1}.jpg",
                "input_image_2": f"{race_2}_{gender_2}_{age_2}.jpg"}
        if coding:
            item["gender_stereotype"] = first_occ
        items.append(item)
    return items


def cell_named_sources() -> pd.DataFrame:
    """The study's 84 portraits as a curated run names them: source id = the cell's name."""
    return pd.DataFrame([
        {"source_id": f"{r}_{g}_{a}", "path": f"data/sources/images/{r}_{g}_{a}.png",
         "sha256": f"{r}{g}{a}".lower(), "race": r, "gender": g, "age": a}
        for r in RACES for g in GENDERS for a in AGES])


def placeholder_sources() -> pd.DataFrame:
    """A stand-in run's placeholder portraits: one per cell, ids that are not the study's."""
    return pd.DataFrame([
        {"source_id": f"syn-{r}-{g}-{a}-0", "path": f"data/sources/images/syn-{r}-{g}-{a}-0.png",
         "sha256": f"syn{r}{g}{a}".lower(), "race": r, "gender": g, "age": a}
        for r in RACES for g in GENDERS for a in AGES])


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data, indent=4))
    return path


# -- names and cells ---------------------------------------------------------------------------

def test_image_names_are_read_by_stem_and_cell() -> None:
    assert image_stem("Black_Male_40s.jpg") == "Black_Male_40s"
    assert image_stem("Black/Black_Male_40s.JPEG") == "Black_Male_40s"
    assert image_stem("Black_Male_40s") == "Black_Male_40s"
    assert image_stem("a.b") == "a.b"                    # not an image extension: kept
    assert parse_cell("SoutheastAsian_Female_70plus") == ("SoutheastAsian", "Female", "70plus")
    assert parse_cell("black_male_40s") == ("Black", "Male", "40s")
    assert parse_cell("Martian_Male_40s") is None
    assert parse_cell("Black_Male") is None
    matcher = SourceMatcher(placeholder_sources())
    for name in ("Black_Male_40s.jpg", "Black_Male_40s.jpeg", "Black_Male_40s.png",
                 "Black_Male_40s"):
        found = matcher.match(name)
        assert found is not None and found.how == "cell"
        assert found.source["source_id"] == "syn-Black-Male-40s-0"
    by_name = SourceMatcher(cell_named_sources())
    found_by_name = [by_name.match(n) for n in
                     ("Black_Male_40s", "Black_Male_40s.png", "Black_Male_40s.jpg")]
    assert [f.how if f else None for f in found_by_name] == ["source_id", "file_name", "stem"]
    assert matcher.match("Martian_Male_40s.jpg") is None


def test_a_cell_with_several_placeholders_gives_the_first_by_source_id() -> None:
    sources = pd.concat([placeholder_sources(), placeholder_sources().assign(
        source_id=lambda f: f["source_id"].str.replace("-0", "-1"),
        path=lambda f: f["path"].str.replace("-0.png", "-1.png"))]).iloc[::-1]
    found = SourceMatcher(sources).match("White_Female_20s.jpg")
    assert found is not None and found.source["source_id"] == "syn-White-Female-20s-0"


# -- the published list and its variant ----------------------------------------------------------

@pytest.mark.parametrize("sources", [cell_named_sources, placeholder_sources])
def test_the_published_list_loads_all_fifty_pairs(tmp_path: Path, sources) -> None:
    path = _write(tmp_path / "winobias_prompts.json", published_list(coding=False))
    paired = load_study_file(path, sources(), OCCUPATIONS)
    assert [p.item.prompt_id for p in paired] == [str(n) for n in range(1, 51)]
    expected_match = "stem" if sources is cell_named_sources else "cell"
    for pair, entry in zip(paired, published_list(coding=False), strict=True):
        item = pair.item
        assert (item.first_match, item.second_match) == (expected_match, expected_match)
        assert item.first_image == entry["input_image_1"]
        race, gender, age = entry["input_image_1"][:-4].split("_")
        assert (item.first_race, item.first_gender, item.first_age) == (race, gender, age)
        assert (pair.first["race"], pair.first["gender"]) == (race, gender)
        assert item.first_race != item.second_race            # cross-race, as published
        assert item.first_source_id == pair.first["source_id"]
        assert item.second_source_id == pair.second["source_id"]
        assert item.roles_from == "matched" and item.stereotype_role == ""
        assert item.metadata == "" and not item.roles_disagree


@pytest.mark.parametrize("sources", [cell_named_sources, placeholder_sources])
def test_the_variant_uses_the_studys_coding_and_agrees_with_matching(tmp_path: Path,
                                                                     sources) -> None:
    plain = load_study_file(_write(tmp_path / "plain.json", published_list(coding=False)),
                            sources(), OCCUPATIONS)
    variant = load_study_file(_write(tmp_path / "coded.json", published_list(coding=True)),
                              sources(), OCCUPATIONS)
    for number, (matched, coded) in enumerate(zip(plain, variant, strict=True), start=1):
        item = coded.item
        assert item.roles_from == "study" and not item.roles_disagree
        assert item.stereotype_role == ("male" if number <= 25 else "female")
        assert (item.male_role, item.female_role) == (matched.item.male_role,
                                                      matched.item.female_role)
        assert item.metadata == ""  # gender_stereotype is read, not kept as an extra key


def test_the_studys_coding_wins_over_the_lists_and_is_counted(tmp_path: Path) -> None:
    entries = published_list(coding=True)[:2]
    # Item 1 as a confused copy codes the female-coded occupation as the man's stereotype.
    entries[0]["gender_stereotype"] = FEMALE_CODED[0]   # "accountant"; the man is first
    entries[1]["note"] = "kept"
    paired = load_study_file(_write(tmp_path / "coded.json", entries), placeholder_sources(),
                             OCCUPATIONS)
    first, second = (p.item for p in paired)
    assert first.roles_disagree and first.stereotype_role == "male"
    assert (first.male_role, first.female_role) == ("accountant", "janitor")
    assert not second.roles_disagree
    assert json.loads(second.metadata) == {"note": "kept"}


def test_the_coding_finds_the_other_occupation_from_the_mapping(tmp_path: Path) -> None:
    from acrb.prompts.winobias import Roles

    entries = [{"id": "7", "prompt": "The welder and the florist swapped hats; he laughed.",
                "input_image_1": "White_Male_20s.jpg", "input_image_2": "Black_Female_30s.jpg",
                "gender_stereotype": "welder"}]
    path = _write(tmp_path / "coded.json", entries)
    with pytest.raises(InputDataError, match="item 7: field gender_stereotype 'welder'"):
        load_study_file(path, placeholder_sources(), OCCUPATIONS)  # neither is listed
    (pair,) = load_study_file(path, placeholder_sources(), OCCUPATIONS,
                              {"7": Roles(male="welder", female="florist")})
    assert (pair.item.male_role, pair.item.female_role, pair.item.roles_from) == (
        "welder", "florist", "study")


def _one(**changes: object) -> list[dict]:
    entry = {**published_list(coding=True)[0], **changes}
    return [{k: v for k, v in entry.items() if v is not None or k == "id"}]


@pytest.mark.parametrize(("entries", "message"), [
    # a missing input_image_2, named with its item and field
    ([{k: v for k, v in published_list(coding=False)[0].items() if k != "input_image_2"}],
     r"item 1: field input_image_2 is missing"),
    # ids: a float, a bool, a null
    (_one(id=3.0), r"entry 0 \(id 3.0\): field id is 3.0 \(float\)"),
    (_one(id=True), r"entry 0: field id is true \(bool\)"),
    (_one(id=None), r"entry 0: field id is null"),
    # an unknown cell, and a cell the sources lack
    (_one(input_image_1="Martian_Male_40s.jpg"),
     r"item 1: field input_image_1 'Martian_Male_40s.jpg' is not among"),
    (_one(input_image_2="White_Female_70plus.jpg"), r"item 1: field input_image_2"),
    # a coding that is not an occupation of the prompt, or not a string
    (_one(gender_stereotype="male"), r"item 1: field gender_stereotype 'male' does not occur"),
    (_one(gender_stereotype="pro"), r"item 1: field gender_stereotype 'pro'"),
    (_one(gender_stereotype=5), r"item 1: field gender_stereotype is 5"),
    (_one(prompt=""), r"item 1: field prompt"),
    (_one(input_image_2="White_Male_20s.jpg"), r"item 1: both images are Male"),
])
def test_malformed_items_are_refused_naming_item_and_field(tmp_path: Path, entries: list,
                                                           message: str) -> None:
    sources = placeholder_sources()
    sources = sources[sources["age"] != "70plus"]
    with pytest.raises(InputDataError, match=message):
        load_study_file(_write(tmp_path / "bad.json", entries), sources, OCCUPATIONS)


@pytest.mark.parametrize(("text", "message"), [
    ('[{"id": ' + "4" * 5000 + "}]", r"a number of 5,000 digits, more than the 4,300"),
    ("[" * 50_000 + "]" * 50_000, r"arrays and objects nested too deeply \(50,000 levels"),
], ids=["huge-number", "deep-nesting"])
def test_what_json_cannot_read_is_refused_naming_the_file(tmp_path: Path, text: str,
                                                          message: str) -> None:
    path = tmp_path / "winobias.json"
    path.write_text(text)
    with pytest.raises(InputDataError, match=f"WinoBias study file {path} cannot be read: it "
                       "holds " + message):
        load_study_file(path, placeholder_sources(), OCCUPATIONS)


def test_a_key_repeated_in_an_item_is_refused_naming_the_item(tmp_path: Path) -> None:
    path = _write(tmp_path / "repeated.json", published_list(coding=False)[:3])
    text = path.read_text()
    # The third item names its first image twice: JSON would keep only the second.
    at = text.index('"input_image_1"', text.index('"id": 3'))
    path.write_text(text[:at] + '"input_image_1": "White_Male_30s.jpg", ' + text[at:])
    with pytest.raises(InputDataError, match=r"WinoBias study file .*repeated\.json, entry 2 "
                       r"\(id 3\): key 'input_image_1' appears twice \(JSON would keep only "
                       r"the last\)"):
        load_study_file(path, placeholder_sources(), OCCUPATIONS)


def test_integer_and_string_ids_are_one_id(tmp_path: Path) -> None:
    entries = published_list(coding=False)[:2]
    entries[1]["id"] = "1"
    with pytest.raises(InputDataError, match="duplicate id 1"):
        load_study_file(_write(tmp_path / "dup.json", entries), placeholder_sources(),
                        OCCUPATIONS)


def test_older_items_migrate_without_the_study_fields() -> None:
    row = {"prompt_id": "W01", "text": "t", "male_role": "a", "female_role": "b",
           "roles_from": "file", "origin": "sentences", "file": "f", "file_sha256": "0" * 64}
    item = WinoBiasItemRecord.model_validate(migrate(row, WinoBiasItemRecord, 2))
    assert item.stereotype_role == "" and item.first_match == "" and not item.roles_disagree


# -- the paper's rate against counts made by hand --------------------------------------------------

def test_the_papers_rate_against_hand_counts() -> None:
    rows = [
        # prompt, gender of first, status, male holder, female holder, stereotyped role
        ("1", "Male", "scored", "first", "second", "male"),      # man took it: follows
        ("2", "Female", "scored", "first", "second", "female"),  # woman first, not hers: no
        ("3", "Female", "scored", "second", "first", "female"),  # woman took it: follows
        ("4", "Male", "scored", "cannot_tell", "first", "male"),  # its role undecided
        ("5", "Male", "not_judged", None, None, "male"),
        ("6", "Male", "scored", "first", "second", ""),          # no coding: both count, 2/2
        ("7", "Female", "scored", "first", "both", ""),          # man's role to the woman: no;
    ]                                                            # hers undecided
    frame = pd.DataFrame(rows, columns=["prompt_id", "gender", "verdict_status",
                                        "male_role_holder", "female_role_holder",
                                        "stereotype_role"])
    frame["race"] = "Black"
    table = winobias_rates(frame, "m", 0.95, 500, 0, planted={"Black": 0.6})
    assert list(table.columns) == RATE_COLUMNS
    assert list(table["role_coding"]) == ["male", "female", STEREOTYPE_ROW]
    paper = table.set_index("role_coding").loc[STEREOTYPE_ROW]
    # counted: 1 yes, 2 no, 3 yes, 6 yes yes, 7 no -> 4 of 6; undecided: 4, 7's female role
    assert (paper["n"], paper["following"], paper["undecided"]) == (6, 4, 2)
    assert paper["rate"] == pytest.approx(4 / 6)
    assert paper["p_value"] == pytest.approx(binomtest(4, 6, 0.5).pvalue)
    assert paper["not_judged"] == 1 and paper["abstained"] == 0
    assert paper["low"] <= 4 / 6 <= paper["high"]
    assert paper["planted"] == pytest.approx(0.6)
    assert paper["definition"] == DEFINITIONS[STEREOTYPE_ROW]
    # The per-role rows are every request's answer, whatever the coding.
    male = table.set_index("role_coding").loc["male"]
    assert (male["n"], male["following"]) == (5, 3)    # 1, 3, 6 follow; 2, 7 do not
    # One sentence: the Wilson interval of the pooled count.
    single = winobias_rates(frame[frame["prompt_id"] == "6"], "m", 0.95, 500, 0)
    row = single.set_index("role_coding").loc[STEREOTYPE_ROW]
    low, high = wilson_interval(np.array([2]), np.array([2]), 0.95)
    assert (row["n"], row["following"]) == (2, 2)
    assert row["low"] == pytest.approx(low[0]) and row["high"] == pytest.approx(high[0])


# -- through the plan and the analysis, on placeholder portraits ----------------------------------

def test_a_study_variant_runs_on_a_stand_in_project(project: Path, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from acrb.analysis.experiments.winobias import write_winobias
    from acrb.config import load_params
    from acrb.stages import evaluate, generate, judge, plan, prompts, sources

    # The tiny project's placeholders: Black and White, 20s and 70plus, one per cell.
    entries = []
    for number in range(1, 9):
        he = number <= 4
        first_race, second_race = ("Black", "White") if number % 2 else ("White", "Black")
        occ = MALE_CODED[number] if he else FEMALE_CODED[number]
        other = FEMALE_CODED[number] if he else MALE_CODED[number]
        entries.append({
            "id": number, "prompt": f"The {occ} met the {other} as "
                                    f"{'he' if he else 'she'} left, scene {number}.",
            "input_image_1": f"{first_race}_{'Male' if he else 'Female'}_20s.jpg",
            "input_image_2": f"{second_race}_{'Female' if he else 'Male'}_70plus.jpg",
            "gender_stereotype": occ})
    entries[0]["gender_stereotype"] = entries[0]["prompt"].split()[4]  # the other: disagrees
    study = _write(tmp_path / "winobias_prompts_with_stereotype.json", entries)
    models = load_params(project / "params.yaml")[0].models
    biased = models["synthetic-biased"].model_dump(exclude_defaults=True)
    biased["config"]["winobias"] = {"stereotype": {"base": 0.9}, "refusal": 0.0}

    def update(p: dict) -> None:
        p["models"] = {"synthetic-biased": biased}
        p["winobias"] = {**WINOBIAS, "study_file": str(study)}
        p["prompts"]["categories"] = ["A"]
        p["prompts"]["ids"] = ["A01"]
        p["plan"]["seeds"] = [0, 1]
        p["analyze"].update(bootstrap=200, permutations=200)
        p["judge"]["use"] = ["sim-judge-b"]

    ctx = update_params(project, update)
    sources.run(ctx)
    prompts.run(ctx)
    with caplog.at_level(logging.WARNING, logger="acrb.prompts.winobias"):
        plan.run(ctx)
    assert "1 study item(s) code their roles otherwise" in caplog.text
    items = read_table(project / "data/plan/winobias_items.parquet", WinoBiasItemRecord)
    assert len(items) == 8 and set(items["first_match"]) == {"cell"}
    assert items["first_source_id"].str.startswith("syn-").all()
    assert list(items["stereotype_role"]) == ["male"] * 4 + ["female"] * 4
    assert items["roles_disagree"].sum() == 1
    generate.run(ctx, "synthetic-biased")
    evaluate.run(ctx, "synthetic-biased")
    judge.run(ctx, "synthetic-biased")
    write_winobias(ctx)
    rates = pd.read_csv(project / layout.WINOBIAS_DIR / "rates.csv").set_index("role_coding")
    paper = rates.loc[STEREOTYPE_ROW]
    # One answer per request (8 items x 2 seeds), not two: the study codes every item.
    assert paper["n"] > 0 and paper["n"] + paper["undecided"] + paper["abstained"] \
        + paper["not_judged"] == 16
    assert rates.loc["male", "n"] + rates.loc["male", "undecided"] \
        + rates.loc["male", "abstained"] + rates.loc["male", "not_judged"] == 16
