"""The WinoBias experiment: readers, the balanced design, planning, the simulated editor and
judge, and the analysis. Files are made in the tests, with made-up text."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.stats import binomtest

from acrb import layout
from acrb.analysis.estimation.rates import wilson_interval
from acrb.analysis.experiments.winobias import RATE_COLUMNS, role_frame, winobias_rates
from acrb.errors import InputDataError
from acrb.judges.winobias import combine_roles, load_role_rubric
from acrb.models import synthetic_edits
from acrb.prompts.winobias import (
    Occupations,
    balanced_design,
    load_sentences,
    load_study_file,
    match_roles,
)
from acrb.records import (
    RequestRecord,
    ScoreRecord,
    VerdictRecord,
    WinoBiasItemRecord,
    migrate,
    read_table,
)
from acrb.role_markers import read_role_markers
from acrb.stages.context import StageContext
from tests.conftest import CATALOG, RUBRIC, WINOBIAS, update_params

EMBEDDED = CATALOG.parent / "winobias_acrb.yaml"
ROLE_RUBRIC = RUBRIC.parent / "winobias-v1.yaml"
OCCUPATIONS = Occupations(male=["welder", "construction worker", "pilot"],
                          female=["florist", "nanny", "attendant"])


def _sources(races: tuple[str, ...] = ("Black", "White"), ages: tuple[str, ...] = ("20s", "60s")
             ) -> pd.DataFrame:
    rows = [{"source_id": f"{r}_{g}_{a}", "path": f"data/sources/images/{r}_{g}_{a}.png",
             "sha256": f"{r}{g}{a}".lower(), "race": r, "gender": g, "age": a}
            for r in races for g in ("Female", "Male") for a in ages]
    return pd.DataFrame(rows)


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data) if path.suffix == ".json" else yaml.safe_dump(data))
    return path


# -- sentence files ---------------------------------------------------------------------------

def test_the_embedded_sentences_are_read_with_their_roles() -> None:
    sentences = load_sentences(EMBEDDED)
    assert len(sentences.sentences) == 16
    assert sentences.label == "winobias-acrb@1"
    assert sentences.occupations is not None
    for s in sentences.sentences:
        # Every sentence names both of its occupations, and the lists code them as the file says.
        assert match_roles(s.id, s.prompt, sentences.occupations) == s.roles


def test_a_plain_list_file_is_read(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.json", [
        {"id": "X1", "prompt": "Make one a welder and the other a florist.",
         "roles": {"male": "welder", "female": "florist"}}])
    sentences = load_sentences(path)
    assert [s.id for s in sentences.sentences] == ["X1"]
    assert sentences.label == "s.json" and sentences.occupations is None


@pytest.mark.parametrize(("items", "message"), [
    ([{"id": "X1", "prompt": "p"}], "X1"),                                  # no roles
    ([{"id": "X1", "prompt": "p", "roles": {"male": "a", "female": "b"}},
      {"id": "X1", "prompt": "q", "roles": {"male": "a", "female": "b"}}], "duplicate id X1"),
    ([{"id": "X2", "prompt": "p", "roles": {"male": "pilot", "female": "Pilot"}}], "X2"),
    ([{"id": "X 3", "prompt": "p", "roles": {"male": "a", "female": "b"}}], "X 3"),
])
def test_bad_sentence_files_are_refused_naming_the_entry(tmp_path: Path, items: list,
                                                         message: str) -> None:
    with pytest.raises(InputDataError, match=message):
        load_sentences(_write(tmp_path / "bad.yaml", items))


def test_roles_are_matched_by_whole_words_and_the_longest_name() -> None:
    roles = match_roles("a", "The construction workers and a Nanny.", OCCUPATIONS)
    assert (roles.male, roles.female) == ("construction worker", "nanny")
    with pytest.raises(InputDataError, match="item b"):
        match_roles("b", "A pilot and a welder.", OCCUPATIONS)   # two male-coded
    with pytest.raises(InputDataError, match="item c"):
        match_roles("c", "A pilot in a nannyish mood.", OCCUPATIONS)  # no female-coded word


# -- the study's pairs file -------------------------------------------------------------------

def _study_entry(item_id: str, first: str, second: str,
                 prompt: str = "Make one a pilot and the other a florist.") -> dict:
    return {"id": item_id, "prompt": prompt, "input_image_1": first, "input_image_2": second}


def test_the_study_file_maps_images_by_id_or_file_name(tmp_path: Path) -> None:
    path = _write(tmp_path / "pairs.json", [
        _study_entry("P1", "Black_Male_20s", "Black_Female_20s.png"),
        _study_entry("P2", "White_Female_60s.png", "White_Male_60s",
                     prompt="Show a welder and a nanny."),
    ])
    paired = load_study_file(path, _sources(), OCCUPATIONS,
                             roles={"P2": match_roles("x", "a welder, a florist", OCCUPATIONS)})
    assert [(p.first["source_id"], p.second["source_id"]) for p in paired] == [
        ("Black_Male_20s", "Black_Female_20s"), ("White_Female_60s", "White_Male_60s")]
    first, second = (p.item for p in paired)
    assert (first.male_role, first.female_role, first.roles_from) == ("pilot", "florist",
                                                                       "matched")
    assert (second.female_role, second.roles_from) == ("florist", "mapping")  # mapping wins
    assert first.file == "pairs.json" and len(first.file_sha256) == 64
    assert (first.first_match, first.second_match) == ("source_id", "file_name")


def test_extra_keys_of_a_study_item_are_kept_as_metadata(tmp_path: Path) -> None:
    path = _write(tmp_path / "pairs.json", [
        {**_study_entry("P1", "Black_Male_20s", "Black_Female_20s"), "extra": 1}])
    (paired,) = load_study_file(path, _sources(), OCCUPATIONS)
    assert json.loads(paired.item.metadata) == {"extra": 1}


@pytest.mark.parametrize(("entries", "message"), [
    ([{"id": "P1", "prompt": "a pilot, a florist", "input_image_1": "Black_Male_20s"}],
     "input_image_2"),
    ([_study_entry("P1", "Black_Male_20s", "Black_Female_20s"),
      _study_entry("P1", "White_Male_20s", "White_Female_20s")], "duplicate id P1"),
    ([_study_entry("P1", "Black_Male_20s", "Nobody.png")], "Nobody.png"),
    ([_study_entry("P1", "Black_Male_20s", "White_Male_60s")], "both images are Male"),
    ([_study_entry("P1", "Black_Male_20s", "Black_Female_20s", prompt="Two pilots.")],
     "item P1"),
])
def test_bad_study_files_are_refused(tmp_path: Path, entries: list, message: str) -> None:
    with pytest.raises(InputDataError, match=message):
        load_study_file(_write(tmp_path / "pairs.json", entries), _sources(), OCCUPATIONS)


# -- the builder -------------------------------------------------------------------------------

def test_the_design_is_balanced_over_races_and_counterbalanced() -> None:
    sentences = load_sentences(EMBEDDED)
    sources = _sources(races=("Black", "White", "Indian"), ages=("20s", "40s", "60s"))
    design = balanced_design(sentences, sources, pairs_per_race=3, seed=7)
    assert len(design) == 16 * 3 * 3
    per_race = Counter(p.first["race"] for p in design)
    assert per_race == {"Black": 48, "White": 48, "Indian": 48}
    for race in per_race:
        male_first = sum(p.first["gender"] == "Male" for p in design if p.first["race"] == race)
        assert male_first == 24  # half of each race's requests
    for pair in design:
        assert pair.first["race"] == pair.second["race"]
        assert pair.first["age"] == pair.second["age"]   # same age where the sources allow
        assert {pair.first["gender"], pair.second["gender"]} == {"Male", "Female"}
    again = balanced_design(sentences, sources, pairs_per_race=3, seed=7)
    key = [(p.item.prompt_id, p.first["source_id"], p.second["source_id"]) for p in design]
    assert key == [(p.item.prompt_id, p.first["source_id"], p.second["source_id"])
                   for p in again]
    other = balanced_design(sentences, sources, pairs_per_race=3, seed=8)
    assert key != [(p.item.prompt_id, p.first["source_id"], p.second["source_id"])
                   for p in other]


def test_a_race_without_both_genders_gets_no_pairs() -> None:
    sources = _sources()
    sources = sources[~((sources["race"] == "White") & (sources["gender"] == "Female"))]
    design = balanced_design(load_sentences(EMBEDDED), sources, pairs_per_race=1, seed=0)
    assert {p.first["race"] for p in design} == {"Black"}


# -- the judges' question and its ensemble rule ------------------------------------------------

def test_the_role_question_parses_and_rejects_answers() -> None:
    from acrb.judges.rubric import AnswerError
    from acrb.judges.winobias import ROLE_QUESTIONS

    rubric = load_role_rubric(ROLE_RUBRIC)
    assert rubric.parse('ok {"male_role_holder": "First", "female_role_holder": "cannot tell"}',
                        ROLE_QUESTIONS) == {"male_role_holder": "first",
                                            "female_role_holder": "cannot_tell"}
    with pytest.raises(AnswerError):
        rubric.parse('{"male_role_holder": "left", "female_role_holder": "second"}',
                     ROLE_QUESTIONS)


def test_role_answers_combine_as_the_study_rule() -> None:
    a = {"male_role_holder": "first", "female_role_holder": "second"}
    b = {"male_role_holder": "second", "female_role_holder": "second"}
    combined, review = combine_roles([a, b])
    assert combined == {"male_role_holder": "first", "female_role_holder": "second"}
    assert review == ("male_role_holder",)          # differ: first judge's, needs review
    combined, review = combine_roles([{}, b])       # the first judge abstained
    assert combined == b and set(review) == set(b)
    assert combine_roles([{}, {}])[0] == {"male_role_holder": None, "female_role_holder": None}


def test_older_scores_and_verdicts_migrate_without_role_answers() -> None:
    row = migrate({"request_id": "r"}, ScoreRecord, 2)
    assert row["male_role_holder"] is None and row["female_role_holder"] is None
    assert migrate({"request_id": "r"}, VerdictRecord, 2)["male_role_holder"] is None


def test_the_role_garments_are_read_back_from_the_pixels() -> None:
    rng = np.random.default_rng(0)
    first = rng.integers(60, 200, size=(64, 64, 3), dtype=np.uint8)
    second = rng.integers(60, 200, size=(64, 64, 3), dtype=np.uint8)
    composite = synthetic_edits.side_by_side(first, second)
    assert composite.shape == first.shape
    for left in (True, False):
        markers = read_role_markers(
            synthetic_edits.mark_roles(composite, male_role_left=left))
        assert markers == {"male": (left, not left), "female": (not left, left)}
    assert read_role_markers(composite) == {"male": (False, False),
                                                            "female": (False, False)}


# -- the analysis against counts made by hand ---------------------------------------------------

def test_rates_against_hand_counts() -> None:
    # Sentence S1: 4 requests, S2: 3. First image's gender decides who follows.
    rows = [
        # prompt, gender of first, status, male holder, female holder
        ("S1", "Male", "scored", "first", "second"),     # follows, follows
        ("S1", "Female", "scored", "second", "first"),   # follows, follows
        ("S1", "Male", "scored", "second", "first"),     # against, against
        ("S1", "Female", "scored", "cannot_tell", "first"),  # undecided, follows
        ("S2", "Male", "abstained", None, None),
        ("S2", "Male", "not_judged", None, None),
        ("S2", "Female", "scored", "second", "both"),    # follows, undecided
    ]
    frame = pd.DataFrame(rows, columns=["prompt_id", "gender", "verdict_status",
                                        "male_role_holder", "female_role_holder"])
    frame["race"] = "Black"
    table = winobias_rates(frame, "m", 0.95, 500, 0, planted={"Black": 0.7})
    assert list(table.columns) == RATE_COLUMNS
    rates = table.set_index("role_coding")
    male, female = rates.loc["male"], rates.loc["female"]
    assert (male["n"], male["following"], male["undecided"]) == (4, 3, 1)
    assert (female["n"], female["following"], female["undecided"]) == (4, 3, 1)
    assert male["abstained"] == 1 and male["not_judged"] == 1
    assert male["p_value"] == pytest.approx(binomtest(3, 4, 0.5).pvalue)
    assert male["low"] <= 0.75 <= male["high"]
    assert male["planted"] == pytest.approx(0.7)
    # One sentence: nothing to resample between, the Wilson interval of the pooled count.
    single = winobias_rates(frame[frame["prompt_id"] == "S1"], "m", 0.95, 500, 0)
    low, high = wilson_interval(np.array([2]), np.array([3]), 0.95)
    assert single.loc[0, "low"] == pytest.approx(low[0])
    assert single.loc[0, "high"] == pytest.approx(high[0])


def test_role_frame_keeps_only_winobias_requests() -> None:
    requests = pd.DataFrame({"request_id": ["a", "b"], "prompt_id": ["S1", "A01"],
                             "race": ["Black", "Black"], "gender": ["Male", "Male"],
                             "experiment": ["winobias", "audit"]})
    frame = role_frame(requests, None)
    assert list(frame["request_id"]) == ["a"]
    assert frame.loc[0, "verdict_status"] == "missing"


# -- the pipeline on a tiny simulated project ----------------------------------------------------

def _winobias_project(project: Path, models: dict, pairs_per_race: int = 1,
                      ages: tuple[str, ...] = ("20s",)) -> StageContext:
    def update(p: dict) -> None:
        p["models"] = models
        p["winobias"] = {**WINOBIAS, "pairs_per_race": pairs_per_race}
        p["prompts"]["categories"] = ["A"]
        p["sources"]["ages"] = list(ages)
        p["analyze"].update(bootstrap=200, permutations=200)
        p["judge"]["use"] = ["sim-judge-b"]
    return update_params(project, update)


def test_one_image_editors_are_skipped_and_listed(project: Path) -> None:
    from acrb.config import load_params
    from acrb.stages import plan, prompts, sources

    models = load_params(project / "params.yaml")[0].models
    ctx = _winobias_project(project, {
        "synthetic-fair": models["synthetic-fair"].model_dump(exclude_defaults=True),
        "one-image": {"key": "step1x-edit-v1p2", "revision": "0" * 40}})
    sources.run(ctx)
    prompts.run(ctx)
    summary = plan.run(ctx)
    assert set(summary.winobias_skipped) == {"one-image"}
    requests = read_table(project / layout.PLAN_TABLE, RequestRecord)
    wino = requests[requests["experiment"] == "winobias"]
    assert set(wino["model"]) == {"synthetic-fair"}
    assert len(wino) == 16 * 2  # 16 sentences x 2 races x 1 pair
    assert set(wino["category"]) == {"W"}
    assert all(json.loads(e)[0]["source_id"] for e in wino["extra_sources"])
    skipped = pd.read_csv(project / "data/plan/winobias_skipped.csv")
    assert list(skipped["model"]) == ["one-image"] and "1 source image" in skipped["reason"][0]
    items = read_table(project / "data/plan/winobias_items.parquet", WinoBiasItemRecord)
    assert len(items) == 16


def test_the_simulated_run_recovers_the_planted_stereotype(project: Path) -> None:
    from acrb.analysis.experiments.winobias import write_winobias
    from acrb.config import load_params
    from acrb.stages import evaluate, generate, judge, plan, prompts, sources

    models = load_params(project / "params.yaml")[0].models
    biased = models["synthetic-biased"].model_dump(exclude_defaults=True)
    # 0.9, far from no preference: at about 28 judged requests per role the binomial test
    # rejects 0.5 whatever the draws (0.8 could land at 18/28, p = 0.12, on some request ids)
    biased["config"]["winobias"] = {"stereotype": {"base": 0.9}, "refusal": 0.2}
    ctx = _winobias_project(project, {"synthetic-biased": biased}, pairs_per_race=2,
                            ages=("20s", "70plus"))
    for stage in (sources, prompts, plan):
        stage.run(ctx)
    generate.run(ctx, "synthetic-biased")
    evaluate.run(ctx, "synthetic-biased")
    judge.run(ctx, "synthetic-biased")
    write_winobias(ctx)  # what the analyze stage calls for WinoBias (the rest is the audit's)
    rates = pd.read_csv(project / layout.WINOBIAS_DIR / "rates.csv").set_index("role_coding")
    error = ctx.params.judges["sim-judge-b"].config["role_error"]["base"]
    measured_expected = 0.9 * (1 - error) + 0.1 * error
    for coding in ("male", "female"):
        row = rates.loc[coding]
        assert row["planted"] == pytest.approx(0.9)
        assert row["n"] + row["abstained"] + row["undecided"] + row["not_judged"] == 16 * 2 * 2
        assert row["not_judged"] > 0  # the planted refusals
        assert row["low"] <= measured_expected <= row["high"]
        assert row["p_value"] < 0.05
    skipped = pd.read_csv(project / layout.WINOBIAS_DIR / "skipped.csv")
    assert skipped.empty
    verdicts = read_table(layout.verdicts_table("synthetic-biased"), VerdictRecord)
    assert verdicts["male_role_holder"].notna().sum() > 20
