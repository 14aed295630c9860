"""The analysis of judge scores (acrb.analysis.agreement.judging) on frames built by hand, with
known answers: agreement against hand-computed kappa and alpha, abstention that depends on the group
and abstention that does not, the mean-score table, and the score tests."""

from __future__ import annotations

import math
import tempfile
from itertools import product
from pathlib import Path

import krippendorff
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score

from acrb.analysis.agreement.judging import (
    ABSTENTION_COLUMNS,
    AGREEMENT_COLUMNS,
    MEAN_COLUMNS,
    SCORE_TEST_COLUMNS,
    abstention_rates,
    judge_agreement,
    judge_means,
    score_tests,
)
from acrb.analysis.inputs import verdict_columns
from acrb.demographics import AGES, RACES
from acrb.records import SCORE_AXES, ScoreRecord, VerdictRecord, read_table, write_table

PROMPTS = ("p0", "p1", "p2")


def design_frame(ages: tuple[str, ...] = ("20s", "70plus")) -> pd.DataFrame:
    """Every race x gender x age source once, each edited under three prompts: an analysis
    frame of ok requests (7 x 2 x len(ages) sources)."""
    rows = []
    for race, gender, age in product(RACES, ("Female", "Male"), ages):
        source = f"{race}-{gender}-{age}"
        for prompt in PROMPTS:
            rows.append({"request_id": f"{source}-{prompt}", "source_id": source,
                         "prompt_id": prompt, "category": "A", "race": race,
                         "gender": gender, "age": age, "status": "ok"})
    return pd.DataFrame(rows)


def score_table(frame: pd.DataFrame, judge: str, status: list[str] | None = None,
                **axes: list[float | None]) -> pd.DataFrame:
    """A judge's score table for the requests of ``frame`` (ScoreRecord columns; axes not
    given are None)."""
    n = len(frame)
    statuses = status or ["scored"] * n
    rows = []
    for i, request_id in enumerate(frame["request_id"]):
        row = {"request_id": request_id, "model": "m", "judge": judge, "judge_id": judge,
               "image_sha256": None, "status": statuses[i],
               **dict.fromkeys(SCORE_AXES)}
        if statuses[i] == "scored":
            row.update({axis: values[i] for axis, values in axes.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def test_agreement_matches_hand_computed_kappa_and_alpha() -> None:
    frame = design_frame()[:3]
    # a = 1, 2, 3 and b = 1, 2, 4 on the 1-5 scale: observed quadratic disagreement 1/3,
    # expected (independent margins) 21/9, so kappa = 1 - (1/3) / (7/3) = 6/7.
    # Cue retention a = 0, .5, 1 and b = 0, 1, 1: interval alpha = 1 - (1/12) / (29/60) = 24/29.
    a = score_table(frame, "g", edit_success=[1, 2, 3], cue_retention=[0.0, 0.5, 1.0],
                    skin_tone=[3, 3, 3])
    b = score_table(frame, "o", edit_success=[1, 2, 4], cue_retention=[0.0, 1.0, 1.0],
                    skin_tone=[3, 3, 3])
    table = judge_agreement({"g": a, "o": b}, frame)
    assert list(table.columns) == list(AGREEMENT_COLUMNS)
    overall = table[table["dimension"] == "all"].set_index("axis")
    assert overall.loc["edit_success", "n_pairs"] == 3
    assert overall.loc["edit_success", "kappa"] == pytest.approx(6 / 7)
    expected_alpha = krippendorff.alpha(reliability_data=[[1, 2, 3], [1, 2, 4]],
                                        level_of_measurement="ordinal",
                                        value_domain=[1, 2, 3, 4, 5])
    assert overall.loc["edit_success", "alpha"] == pytest.approx(expected_alpha)
    assert overall.loc["cue_retention", "alpha"] == pytest.approx(24 / 29)
    assert math.isnan(overall.loc["cue_retention", "kappa"])
    assert overall.loc["cue_retention", "level"] == "interval"
    # Every score 3 for both judges: chance-corrected agreement is 0/0, NaN with a note.
    assert math.isnan(overall.loc["skin_tone", "kappa"])
    assert math.isnan(overall.loc["skin_tone", "alpha"])
    assert "one category only" in overall.loc["skin_tone", "note"]
    # An axis neither judge scored has no pairs.
    assert overall.loc["race_change", "n_pairs"] == 0


def test_agreement_by_group_uses_that_groups_pairs() -> None:
    frame = design_frame()
    black = (frame["race"] == "Black").to_numpy()
    rng = np.random.default_rng(1)
    first = rng.integers(1, 6, len(frame))
    # The judges agree exactly on White faces and disagree at random on Black faces.
    second = np.where(black, rng.integers(1, 6, len(frame)), first)
    table = judge_agreement({"g": score_table(frame, "g", edit_success=list(first)),
                             "o": score_table(frame, "o", edit_success=list(second))}, frame)
    rows = table[(table["axis"] == "edit_success") & (table["dimension"] == "race")]
    rows = rows.set_index("group")
    assert rows.loc["White", "kappa"] == pytest.approx(1.0)
    assert rows.loc["White", "alpha"] == pytest.approx(1.0)
    assert rows.loc["Black", "kappa"] < 0.9
    on_black = black & (frame["race"] == "Black").to_numpy()
    assert rows.loc["Black", "kappa"] == pytest.approx(
        cohen_kappa_score(first[on_black], second[on_black], labels=[1, 2, 3, 4, 5],
                          weights="quadratic"))
    assert rows.loc["Black", "n_pairs"] == on_black.sum()
    # Abstentions are no pair: only requests both judges scored count.
    status = ["abstained" if b else "scored" for b in black]
    table = judge_agreement({"g": score_table(frame, "g", status, edit_success=list(first)),
                             "o": score_table(frame, "o", edit_success=list(second))}, frame)
    black_row = table[(table["axis"] == "edit_success") & (table["group"] == "Black")]
    assert int(black_row["n_pairs"].iloc[0]) == 0
    assert "fewer than two pairs" in black_row["note"].iloc[0]


def test_abstention_that_depends_on_race_is_found() -> None:
    frame = design_frame()
    black = frame["race"] == "Black"
    # Judge g abstains on every Black face; judge o on the first prompt of every face (no
    # group difference); g errs on one request.
    g_status = ["abstained" if b else "scored" for b in black]
    g_status[-1] = "error"  # a White face
    o_status = ["abstained" if p == "p0" else "scored" for p in frame["prompt_id"]]
    scores = {"g": score_table(frame, "g", g_status, edit_success=[3] * len(frame)),
              "o": score_table(frame, "o", o_status, edit_success=[3] * len(frame))}
    table = abstention_rates(scores, frame, n_perm=2000, seed=3)
    assert list(table.columns) == list(ABSTENTION_COLUMNS)
    g = table[(table["judge"] == "g") & (table["event"] == "abstention")]
    race = g[g["dimension"] == "race"].set_index("group")
    assert race.loc["Black", "rate"] == 1.0 and race.loc["White", "rate"] == 0.0
    assert race.loc["Black", "n"] == 12 and race.loc["Black", "k"] == 12
    assert race.loc["White", "ci_high"] < 0.3  # Wilson at 0 / 12
    assert race["delta"].iloc[0] == 1.0
    # 4 Black faces among 28, labels permuted within gender x age: p is about 1/343.
    assert race["p_value"].iloc[0] < 0.01
    assert race["p_adjusted"].iloc[0] < 0.05
    gender = g[g["dimension"] == "gender"]
    assert gender["rate"].nunique() == 1 and gender["p_value"].iloc[0] > 0.5
    pooled = g[g["dimension"] == "all"].iloc[0]
    assert pooled["k"] == 12 and pooled["n"] == len(frame)
    o = table[(table["judge"] == "o") & (table["event"] == "abstention")
              & (table["dimension"] == "race")]
    assert np.allclose(o["rate"], 1 / 3) and (o["p_value"] == 1.0).all()
    errors = table[(table["judge"] == "g") & (table["event"] == "error")
                   & (table["dimension"] == "all")]
    assert errors["k"].iloc[0] == 1


def test_abstention_counts_only_requests_the_judge_was_asked() -> None:
    frame = design_frame()
    status = ["not_judged" if p == "p2" else "scored" for p in frame["prompt_id"]]
    status[0] = "abstained"
    table = abstention_rates({"g": score_table(frame, "g", status, edit_success=[3] * 84)},
                             frame, n_perm=200)
    pooled = table[(table["event"] == "abstention") & (table["dimension"] == "all")].iloc[0]
    assert pooled["n"] == 2 * 28 and pooled["k"] == 1


def test_needs_review_rate_by_group_from_verdicts() -> None:
    frame = design_frame()
    verdicts = pd.DataFrame({
        "request_id": frame["request_id"], "model": "m", "judges": "g,o", "rule": "study",
        "status": ["not_judged" if p == "p2" else "scored" for p in frame["prompt_id"]],
        "edit_success": 3.0,
        "needs_review": (frame["gender"] == "Female").to_numpy()})
    joined = frame.merge(verdict_columns(_through_schema(verdicts)), on="request_id")
    table = abstention_rates({}, joined, n_perm=500)
    review = table[(table["event"] == "needs_review") & (table["dimension"] == "gender")]
    review = review.set_index("group")
    assert review.loc["Female", "rate"] == 1.0 and review.loc["Male", "rate"] == 0.0
    assert review.loc["Female", "n"] == 14 * 2  # p2 was not judged
    assert review["p_value"].iloc[0] < 0.01
    assert (table["judge"] == "ensemble").all()


def _through_schema(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The verdicts as the judge stage stores them (validated, typed columns)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "verdicts.parquet"
        write_table(path, verdicts, VerdictRecord)
        return read_table(path, VerdictRecord)


def test_judge_means_per_axis_with_source_clustered_interval() -> None:
    frame = design_frame()
    rng = np.random.default_rng(0)
    source_effect = frame["source_id"].map(
        {s: rng.normal(0, 1) for s in frame["source_id"].unique()})
    edit = np.clip(np.round(3 + source_effect + rng.normal(0, 0.3, len(frame))), 1, 5)
    frame = frame.assign(edit_success=edit, cue_retention=0.5, skin_tone=np.nan,
                         race_change=np.nan, gender_change=np.nan, age_change=np.nan,
                         aging_accuracy=np.nan)
    frame.loc[0, "status"] = "refused"
    frame.loc[0, "edit_success"] = np.nan
    frame.loc[1, "status"] = "error"  # an errored request never counts, even with a score
    table = judge_means(frame, n_boot=500, seed=1).set_index("axis")
    assert list(table.reset_index().columns) == list(MEAN_COLUMNS)
    assert table.loc["edit_success", "n"] == len(frame) - 2
    assert table.loc["edit_success", "n_sources"] == 28
    assert table.loc["edit_success", "mean"] == pytest.approx(edit[2:].mean())
    low, high = table.loc["edit_success", ["ci_low", "ci_high"]]
    assert low < edit[2:].mean() < high
    # Scores vary by source: the interval is wider than one counting 82 independent requests.
    naive = 1.96 * edit[2:].std(ddof=1) / math.sqrt(len(frame) - 2)
    assert (high - low) / 2 > 1.2 * naive
    assert table.loc["cue_retention", "mean"] == 0.5
    assert table.loc["cue_retention", "ci_low"] == pytest.approx(0.5)
    assert table.loc["skin_tone", "n"] == 0 and math.isnan(table.loc["skin_tone", "mean"])
    assert list(table.index) == list(SCORE_AXES)


def test_score_tests_find_a_race_effect_and_not_a_gender_one() -> None:
    frame = design_frame(AGES)
    rng = np.random.default_rng(2)
    # Edit success about 2 on Black faces, 4 elsewhere; no gender effect.
    centre = np.where(frame["race"] == "Black", 2.0, 4.0)
    frame["edit_success"] = np.clip(np.round(centre + rng.normal(0, 0.6, len(frame))), 1, 5)
    table = score_tests(frame, 0.05, axes=("edit_success", "skin_tone"))
    assert list(table.columns) == list(SCORE_TEST_COLUMNS)
    assert set(table["axis"]) == {"edit_success"}  # no skin tone score: left out
    rows = table.set_index(["dimension", "test"])
    kw = rows.loc[("race", "Kruskal-Wallis + Dunn")]
    assert kw["significant"] and kw["p_adjusted"] < 0.01
    assert kw["n"] == 84  # source means
    assert "Black vs" in kw["posthoc"]
    assert rows.loc[("race", "proportional odds (score test)"), "p_adjusted"] < 0.05
    assert not rows.loc[("gender", "Kruskal-Wallis + Dunn"), "significant"]
    # Holm over the six tests: every adjusted p is at least its raw p.
    assert (table["p_adjusted"] >= table["p_value"] - 1e-12).all()
    assert len(table) == 6


def test_verdict_columns_keep_outcomes_and_scores(tmp_path: Path) -> None:
    verdicts = pd.DataFrame({
        "request_id": ["r1", "r2"], "model": "m", "judges": "g,o", "rule": "study",
        "status": ["scored", "not_judged"], "edit_success": [2.0, None],
        "needs_review": [True, False], "review_axes": ["edit_success", ""],
        "soft_erasure": [True, None]})
    write_table(tmp_path / "v.parquet", verdicts, VerdictRecord)
    columns = verdict_columns(read_table(tmp_path / "v.parquet", VerdictRecord))
    assert columns["verdict_status"].tolist() == ["scored", "not_judged"]
    assert columns["soft_erasure"].iloc[0] and pd.isna(columns["soft_erasure"].iloc[1])
    assert columns["judge_needs_review"].tolist() == [True, False]
    assert "status" not in columns and "needs_review" not in columns


def test_score_tables_written_by_schema_are_read(tmp_path: Path) -> None:
    frame = design_frame()[:6]
    table = score_table(frame, "g", ["scored"] * 5 + ["abstained"], edit_success=[1, 2, 3, 4, 5,
                                                                                  None])
    write_table(tmp_path / "g.parquet", table, ScoreRecord)
    read = read_table(tmp_path / "g.parquet", ScoreRecord)
    agreement = judge_agreement({"g": read, "o": read}, frame)
    row = agreement[(agreement["axis"] == "edit_success") & (agreement["dimension"] == "all")]
    assert row["kappa"].iloc[0] == pytest.approx(1.0) and row["n_pairs"].iloc[0] == 5
