"""The cells of the paper's tables on small known designs, without a project: each builder of
:mod:`acrb.analysis.outputs.paper_tables` against numbers worked by hand or by scipy and
statsmodels, and each header over its own number once shown. These run in about a second, so
mutation testing mutates the tables' cell selection against them (docs/mutation.md); the
stage's own test on a judged and reviewed project is tests/test_paper_tables.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from acrb.analysis.outputs import paper_tables

MODEL = "synthetic-biased"


def _small_frame(scores: dict[str, list[float | None]], races: list[str],
                 status: list[str] | None = None, arm: str | None = None) -> pd.DataFrame:
    """An analysis frame of one request per row: source i (race ``races[i]``) under prompt
    P<i % 2> (both category B), with the given ensemble scores (None: no score)."""
    n = len(races)
    frame = pd.DataFrame({
        "request_id": [f"r{i}{arm or ''}" for i in range(n)],
        "source_id": [f"s{i}" for i in range(n)],
        "prompt_id": [f"P{i % 2}" for i in range(n)], "category": "B",
        "status": status or ["ok"] * n, "race": races, "gender": "Female", "age": "20s",
        "seed": 0, "experiment": "audit"})
    for axis, values in scores.items():
        frame[axis] = pd.array(values, dtype="Float64").astype(float)
    if arm is not None:
        frame["arm"] = arm
    return frame


SETTINGS = paper_tables.Resampling(n_boot=50, n_perm=50)


def test_edit_success_is_the_share_at_4_or_more_beside_the_mean() -> None:
    # 8 answered requests with a score, one refused without a score: 5 of 8 are >= 4.
    scores = [5, 4, 4, 3, 1, 2, 5, 4, None]
    frame = _small_frame({"edit_success": scores}, ["Black", "White"] * 4 + ["Black"],
                         status=["ok"] * 8 + ["refused"])
    frame["soft_erasure"] = pd.array([s is not None and s <= 2 for s in scores[:8]] + [None],
                                     dtype="boolean")
    table = paper_tables.model_summary({MODEL: frame}, SETTINGS).iloc[0]
    assert table["edit_success_ge4"] == pytest.approx(5 / 8)
    assert table["edit_success_ge4_n"] == 8
    assert table["edit_success"] == pytest.approx(28 / 8)
    assert table["edit_success_ge4_low"] <= 5 / 8 <= table["edit_success_ge4_high"]
    assert table["soft_erasure"] == pytest.approx(2 / 8)
    assert "edit_success >= 4" in table["definition"]
    # The interval is the clustered Wilson one of a rate (as every rate of the tables).
    block = paper_tables.pooled_block(paper_tables.with_score_outcomes(frame),
                                      "edit_success_ge4")
    from acrb.analysis.estimation.resampling import rate_intervals
    low, high = rate_intervals(block, 0.95)
    assert (table["edit_success_ge4_low"], table["edit_success_ge4_high"]) == pytest.approx(
        (low[0], high[0]))


def test_race_change_at_both_thresholds_per_race() -> None:
    # Black: 1, 3, 4, 5 -> >= 3: 3/4, >= 4: 2/4; White: 2, 3, 1, None -> 1/3 and 0/3.
    frame = _small_frame({"race_change": [1, 2, 3, 3, 4, 1, 5, None]},
                         ["Black", "White"] * 4)
    table = paper_tables.race_rates({MODEL: frame}, SETTINGS,
                                    outcomes=paper_tables.RACE_CHANGE_OUTCOMES)
    rate = table.set_index(["outcome", "race"])["rate"]
    assert rate["race_change_ge3", "Black"] == pytest.approx(3 / 4)
    assert rate["race_change_ge4", "Black"] == pytest.approx(2 / 4)
    assert rate["race_change_ge3", "White"] == pytest.approx(1 / 3)
    assert rate["race_change_ge4", "White"] == pytest.approx(0.0)
    assert table.set_index(["outcome", "race"])["n"]["race_change_ge3", "White"] == 3
    definitions = dict(zip(table["outcome"], table["definition"], strict=False))
    assert "race_change >= 3" in definitions["race_change_ge3"]
    assert "race_change >= 4" in definitions["race_change_ge4"]
    gap = paper_tables.race_gap({MODEL: frame}, SETTINGS).set_index("outcome")
    assert gap.loc["race_change_ge3", "gap"] == pytest.approx(3 / 4 - 1 / 3)
    assert gap.loc["race_change_ge4", "gap"] == pytest.approx(2 / 4)
    assert "race_change >= 4" in gap.loc["race_change_ge4", "definition"]
    assert "race_change >= 3" in gap.loc["race_change_ge3", "definition"]


def test_acrb_race_drift_stays_beside_only_where_it_differs() -> None:
    from acrb.config import OutcomeRule
    at_3 = {"race_drift": OutcomeRule(axis="race_change", at_least=3)}
    at_2 = {"race_drift": OutcomeRule(axis="race_change", at_least=2)}
    assert paper_tables.race_change_outcomes(at_3) == ("race_change_ge3", "race_change_ge4")
    assert paper_tables.race_change_outcomes(at_2) == ("race_change_ge3", "race_change_ge4",
                                                       "race_drift")
    assert "race_change >= 2" in paper_tables.definition("race_drift", at_2)
    assert "params judge.outcomes.race_drift" in paper_tables.definition("race_drift", at_2)


def test_feature_scores_are_mean_score_changes_per_race() -> None:
    none = _small_frame({"race_change": [3, 1, 4, 1], "skin_tone": [4, 3, 5, 3]},
                        ["Black", "White", "Black", "White"], arm="none")
    feature = _small_frame({"race_change": [1, 1, 2, 2], "skin_tone": [3, 3, 3, None]},
                           ["Black", "White", "Black", "White"], arm="feature")
    table = paper_tables.feature_scores({MODEL: pd.concat([none, feature])}, SETTINGS)
    change = table.set_index(["axis", "race"])
    # Race change: Black (3 -> 1, 4 -> 2): -2; White (1 -> 1, 1 -> 2): +0.5; all: -0.75.
    assert change.loc[("race_change", "Black"), "change"] == pytest.approx(-2.0)
    assert change.loc[("race_change", "White"), "change"] == pytest.approx(0.5)
    assert change.loc[("race_change", "all"), "change"] == pytest.approx(-0.75)
    assert change.loc[("race_change", "Black"), "mean_none"] == pytest.approx(3.5)
    assert change.loc[("race_change", "Black"), "mean_feature"] == pytest.approx(1.5)
    # Skin tone: White's second pair has no feature score, so it is one pair (3 -> 3).
    assert change.loc[("skin_tone", "White"), "n_pairs"] == 1
    assert change.loc[("skin_tone", "White"), "change"] == pytest.approx(0.0)
    assert change.loc[("skin_tone", "Black"), "change"] == pytest.approx(-1.5)
    assert change.loc[("race_change", "all"), "low"] <= -0.75 <= change.loc[
        ("race_change", "all"), "high"]
    assert set(table["axis"]) == {"race_change", "skin_tone"}


def test_white_vs_nonwhite_is_scipys_mann_whitney_with_holm() -> None:
    from scipy.stats import mannwhitneyu
    from statsmodels.stats.multitest import multipletests
    races = ["White", "Black", "Indian", "White", "Latino", "White", "Black", "EastAsian"]
    skin = [3, 5, 4, 3, 5, 4, 5, 4]
    race = [1, 2, 3, 1, 2, 1, 4, None]
    frames = {MODEL: _small_frame({"skin_tone": skin, "race_change": race}, races),
              "other": _small_frame({"skin_tone": skin[::-1], "race_change": race[::-1]},
                                    races)}
    table = paper_tables.white_vs_nonwhite(frames)
    assert list(table.columns) == list(paper_tables.MANN_WHITNEY_COLUMNS)
    for row in table.itertuples():
        frame = frames[row.model]
        values = frame[row.axis]
        white = values[(frame["race"] == "White") & values.notna()]
        other = values[(frame["race"] != "White") & values.notna()]
        expected = mannwhitneyu(white, other, alternative="two-sided")
        assert (row.n_white, row.n_other) == (len(white), len(other))
        assert row.u == pytest.approx(expected.statistic)
        assert row.p_value == pytest.approx(expected.pvalue)
        assert row.mean_white == pytest.approx(white.mean())
    holm = multipletests(table["p_value"], method="holm")[1]
    assert table["p_holm"].to_numpy() == pytest.approx(holm)
    assert len(table) == 4 and table["p_holm"].gt(table["p_value"]).any()
    shown = paper_tables.SPECS["white_vs_nonwhite"].display(table)
    assert "independent" in shown.caption and "clustered" in shown.caption


def _units() -> pd.DataFrame:
    """Reviewed units of two models with judge and human (consensus) scores."""
    return pd.DataFrame({
        "model": ["a", "a", "a", "b", "b"],
        "judge_edit_success": [5, 4, None, 3, 2], "human_edit_success": [4, 2, 3, 3, 1],
        "judge_race_change": [1, 2, 1, 1, 3], "human_race_change": [1, 1, 1, None, 2]})


def test_judge_human_means_per_model_and_their_check_against_the_review() -> None:
    from acrb.analysis.agreement.raters import judge_human_agreement
    units = _units()
    means = paper_tables.judge_human_means(units, ["edit_success", "race_change"])
    got = means.set_index(["model", "axis"])
    # Model a, edit success: the unit without a judge score is left out of both means.
    assert got.loc[("a", "edit_success"), ["n", "judge_mean", "human_mean"]].tolist() == \
        pytest.approx([2, 4.5, 3.0])
    assert got.loc[("b", "race_change"), ["n", "judge_mean", "human_mean"]].tolist() == \
        pytest.approx([1, 3.0, 2.0])
    assert got.loc[("all", "edit_success"), ["n", "judge_mean", "human_mean"]].tolist() == \
        pytest.approx([4, 3.5, 2.5])
    # The review stage's own table on the same units is reproduced; a shifted one is not.
    review_units = units.assign(output="edited", race="Black", gender="Female", age="20s")
    review = judge_human_agreement(review_units, axes=["edit_success", "race_change"])
    assert paper_tables.means_reproduce(review, means)
    shifted = review.assign(mean_difference=review["mean_difference"] + 0.5)
    assert not paper_tables.means_reproduce(shifted, means)
    table = paper_tables.judge_human(review, None, means, "mean")
    assert list(table.columns) == list(paper_tables.JUDGE_HUMAN_COLUMNS)
    assert list(table["model"]) == ["a", "a", "b", "b", "all", "all"]
    row = table.set_index(["model", "axis"]).loc[("a", "edit_success")]
    assert (row["judge_mean"], row["human_mean"]) == pytest.approx((4.5, 3.0))
    assert row["mean_difference"] == pytest.approx(1.5) and row["consensus"] == "mean"
    shown = paper_tables.SPECS["judge_human"].display(table)
    assert "the mean of an output's ratings" in shown.caption


def test_table_1_shows_the_age_axis_the_judges_produced_under_its_own_name() -> None:
    acrb = _small_frame({"edit_success": [4, 5], "age_change": [1, 2],
                         "age_direction": [None, None]}, ["Black", "White"])
    study = _small_frame({"edit_success": [4, 5], "age_direction": [3, 4],
                          "age_change": [None, None]}, ["Black", "White"])
    header = paper_tables.SPECS["judge_means"].display(
        paper_tables.judge_means({MODEL: acrb}, SETTINGS)).header
    assert header[-1] == "ACRB age change (1 same-5 complete)"
    assert "Age change" not in header
    table = paper_tables.judge_means({MODEL: study}, SETTINGS)
    header = paper_tables.SPECS["judge_means"].display(table).header
    assert header[-1] == "Age change" and "ACRB age change (1 same-5 complete)" not in header
    age = table.set_index("axis").loc["age_direction"]
    assert age["mean"] == pytest.approx(3.5) and "much younger" in age["definition"]


def test_winobias_renders_the_single_rate_when_the_analysis_wrote_it() -> None:
    rows = [{"model": MODEL, "role_coding": c, "n": 10, "following": k, "rate": k / 10,
             "low": 0.1, "high": 0.9, "p_value": 0.5, "abstained": 0, "confidence": 0.95}
            for c, k in (("male", 8), ("female", 6))]
    without = paper_tables.winobias(pd.DataFrame(rows), None)
    assert list(without["role_coding"]) == ["male", "female"]
    shown = paper_tables.SPECS["winobias"].display(without)
    assert [r[1] for r in shown.rows] == ["male", "female"]
    paper = {**rows[0], "role_coding": paper_tables.WINOBIAS_PAPER_ROW, "n": 20,
             "following": 14, "rate": 0.7, "definition": "both codings pooled"}
    table = paper_tables.winobias(pd.DataFrame([*rows, paper]), None)
    assert list(table["role_coding"]) == ["stereotype", "male", "female"]
    shown = paper_tables.SPECS["winobias"].display(table)
    assert shown.rows[0][1:5] == ["both (paper)", "14/20", "70.0 [10.0, 90.0]", "30.0"]
    assert "both codings pooled" in shown.caption


# Header pinning: each header sits over its own column.


def _cell_under(shown: paper_tables.Display, header: str, row: int = 0) -> str:
    return shown.rows[row][shown.header.index(header)]


def test_table_3_headers_sit_over_their_columns() -> None:
    frame = pd.DataFrame([{
        "model": MODEL, "confidence": 0.95, "definition": "",
        **{f"{m}{suffix}": value for m, value in (
            ("edit_success_ge4", 0.61), ("edit_success", 4.22), ("soft_erasure", 0.13),
            ("race_change_ge3", 0.27), ("race_change_ge4", 0.09), ("race_drift", 0.44))
           for suffix, value in (("", value), ("_low", math.nan), ("_high", math.nan),
                                 ("_n", 10))}}])
    shown = paper_tables.SPECS["model_summary"].display(frame)
    assert _cell_under(shown, "Edit success >= 4 (%)") == "61.0"
    assert _cell_under(shown, "Edit success (mean, 1-5)") == "4.22"
    assert _cell_under(shown, "Soft erasure (%)") == "13.0"
    assert _cell_under(shown, "Race change >= 3 (%)") == "27.0"
    assert _cell_under(shown, "Race change >= 4 (%)") == "9.0"
    assert _cell_under(shown, "Race drift, ACRB (%)") == "44.0"


def test_tables_1_2_4_8_9_and_7_headers_sit_over_their_columns() -> None:
    frame = _small_frame({"edit_success": [5, 4, 4, 1], "skin_tone": [3, 4, 5, 5],
                          "race_change": [1, 3, 4, 1], "gender_change": [1, 1, 2, 2],
                          "age_change": [2, 2, 2, 2]}, ["Black", "White"] * 2)
    frame["judge_lightening"] = pd.array([False, True, True, True], dtype="boolean")
    means = paper_tables.judge_means({MODEL: frame}, SETTINGS)
    shown = paper_tables.SPECS["judge_means"].display(means)
    for axis, expected in (("Edit success", "3.50"), ("Skin tone", "4.25"),
                           ("Race change", "2.25"), ("Gender change", "1.50")):
        assert _cell_under(shown, axis).startswith(expected), axis
    rates = paper_tables.race_rates({MODEL: frame}, SETTINGS)
    shown = paper_tables.SPECS["race_rates"].display(rates)
    black = [r[0] for r in shown.rows].index("Black")
    assert _cell_under(shown, f"{MODEL}: Judged skin lightening (%)", black).startswith("50.0")
    assert _cell_under(shown, f"{MODEL}: Race change >= 3 (%)", black).startswith("50.0")
    assert _cell_under(shown, f"{MODEL}: Race change >= 4 (%)", black).startswith("50.0")
    white = [r[0] for r in shown.rows].index("White")
    assert _cell_under(shown, f"{MODEL}: Judged skin lightening (%)", white).startswith("100.0")
    assert _cell_under(shown, f"{MODEL}: Race change >= 3 (%)", white).startswith("50.0")
    assert _cell_under(shown, f"{MODEL}: Race change >= 4 (%)", white).startswith("0.0")
    gap = paper_tables.race_gap({MODEL: frame}, SETTINGS)
    shown = paper_tables.SPECS["race_gap"].display(gap)
    assert [_cell_under(shown, "Outcome", i) for i in range(2)] == ["Race change >= 3",
                                                                    "Race change >= 4"]
    assert _cell_under(shown, "White", 1) == "0.0" and _cell_under(shown, "Black", 1) == "50.0"
    assert _cell_under(shown, "Gap (pp)", 1).startswith("50.0")
    mw = paper_tables.white_vs_nonwhite({MODEL: frame})
    shown = paper_tables.SPECS["white_vs_nonwhite"].display(mw)
    skin = [r[1] for r in shown.rows].index("Skin tone")
    assert _cell_under(shown, "Mean White", skin) == "4.50"
    assert _cell_under(shown, "Mean other", skin) == "4.00"
    assert _cell_under(shown, "n White", skin) == "2"
    assert _cell_under(shown, "U", skin) == fmt_u(mw, "skin_tone")
    table = pd.DataFrame([{"model": MODEL, "axis": "race_change", "race": "Black",
                           "change": -1.25, "low": math.nan, "high": math.nan},
                          {"model": MODEL, "axis": "skin_tone", "race": "Black",
                           "change": 0.5, "low": math.nan, "high": math.nan}])
    shown = paper_tables.SPECS["feature_scores"].display(table)
    assert _cell_under(shown, "Race change change") == "-1.25"
    assert _cell_under(shown, "Skin tone change") == "0.50"
    human = pd.DataFrame([{c: math.nan for c in paper_tables.JUDGE_HUMAN_COLUMNS}])
    human = human.assign(model=MODEL, axis="skin_tone", n=9, judge_mean=3.71, human_mean=3.22,
                         mean_difference=0.49, weighted_kappa=0.11, spearman=0.33,
                         human_alpha=0.44, human_alpha_interval=0.52, consensus="mean")
    shown = paper_tables.SPECS["judge_human"].display(human)
    assert [_cell_under(shown, h) for h in (
        "Judges' mean", "People's mean", "Judge - human", "Weighted kappa", "Spearman",
        "Human alpha (interval)", "Human alpha (ordinal)")] == \
        ["3.71", "3.22", "0.49", "0.11", "0.33", "0.52", "0.44"]


def fmt_u(table: pd.DataFrame, axis: str) -> str:
    return f"{float(table.set_index('axis').loc[axis, 'u']):.1f}"


# The rest pins what mutation testing found unpinned: each builder's row and column choice,
# the empty and missing cases, and the text of every cell and caption.


def test_numbers_are_printed_as_the_tables_print_them() -> None:
    assert paper_tables.fmt_pct(0.1234) == "12.3"
    assert paper_tables.fmt_pct(0.1234, 0.1, 0.15) == "12.3 [10.0, 15.0]"
    assert paper_tables.fmt_pct(-0.0, -0.0, 0.2) == "0.0 [0.0, 20.0]"
    assert paper_tables.fmt_pct(0.5, math.nan, 0.6) == "50.0"
    assert paper_tables.fmt_pct(0.5, 0.4, None) == "50.0"
    assert paper_tables.fmt_pct(math.nan, 0.1, 0.2) == "--"
    assert paper_tables.fmt_pct(None) == "--" and paper_tables.fmt_pct(pd.NA) == "--"
    assert paper_tables.fmt_num(3.14159) == "3.14"
    assert paper_tables.fmt_num(-0.0) == "0.00"
    assert paper_tables.fmt_num(3.14159, 2.5, 3.75) == "3.14 [2.50, 3.75]"
    assert paper_tables.fmt_num(3.14159, 2.5, 3.75, digits=1) == "3.1 [2.5, 3.8]"
    assert paper_tables.fmt_num(1.0, 0.5, math.nan) == "1.00"
    assert paper_tables.fmt_num(math.nan) == "--" and paper_tables.fmt_num(None) == "--"
    assert paper_tables.fmt_p(0.0004) == "<0.001"
    assert paper_tables.fmt_p(0.001) == "0.001"
    assert paper_tables.fmt_p(0.01234) == "0.012"
    assert paper_tables.fmt_p(math.nan) == "--" and paper_tables.fmt_p(None) == "--"
    assert paper_tables.fmt_pct(0.0) == "0.0" and paper_tables.fmt_num(0) == "0.00"


def test_each_bound_of_a_params_outcome_is_named_in_its_definition() -> None:
    from acrb.config import OutcomeRule
    rules = {"a": OutcomeRule(axis="skin_tone", at_least=4),
             "b": OutcomeRule(axis="edit_success", at_most=2),
             "c": OutcomeRule(axis="race_change", below=1.5),
             "d": OutcomeRule(axis="age_direction", outside=(2.5, 3.5))}
    texts = {name: paper_tables.definition(name, rules) for name in rules}
    assert texts["a"] == ("share of answered requests with ensemble skin_tone >= 4 "
                          "(ACRB's a, params judge.outcomes.a)")
    assert texts["b"].startswith("share of answered requests with ensemble edit_success <= 2 ")
    assert texts["c"].startswith("share of answered requests with ensemble race_change < 1.5 ")
    assert texts["d"].startswith(
        "share of answered requests with ensemble age_direction outside [2.5, 3.5] ")
    # A fixed-threshold outcome keeps the paper's definition whatever params say.
    assert paper_tables.definition("race_change_ge3", rules) == \
        paper_tables.DEFINITIONS["race_change_ge3"]
    assert paper_tables.definition("hard_refusal") == (
        "share of answered requests with hard refusal (params judge.outcomes)")
    assert paper_tables.definition("x", rules) == (
        "share of answered requests with x (params judge.outcomes)")


def test_race_drift_is_a_column_of_its_own_unless_it_is_the_papers() -> None:
    from acrb.config import OutcomeRule
    assert paper_tables.race_change_outcomes(None) == paper_tables.RACE_CHANGE_OUTCOMES
    assert paper_tables.race_change_outcomes({}) == paper_tables.RACE_CHANGE_OUTCOMES
    at_4 = {"race_drift": OutcomeRule(axis="race_change", at_least=4)}
    assert paper_tables.race_change_outcomes(at_4) == paper_tables.RACE_CHANGE_OUTCOMES
    other_axis = {"race_drift": OutcomeRule(axis="skin_tone", at_least=3)}
    assert paper_tables.race_change_outcomes(other_axis)[-1] == "race_drift"
    below = {"race_drift": OutcomeRule(axis="race_change", below=3)}
    assert paper_tables.race_change_outcomes(below)[-1] == "race_drift"
    assert [m for m, _ in paper_tables.summary_measures(other_axis)] == [
        "edit_success_ge4", "edit_success", "soft_erasure", "race_change_ge3",
        "race_change_ge4", "race_drift"]
    assert [k for _, k in paper_tables.summary_measures(None)] == [
        "rate", "mean", "rate", "rate", "rate"]
    assert paper_tables.summary_columns([("a", "rate"), ("b", "mean")]) == [
        "model", "a_n", "a", "a_low", "a_high", "b_n", "b", "b_low", "b_high", "confidence",
        "definition"]


def test_score_outcomes_hold_at_their_bound_and_are_missing_without_a_score() -> None:
    frame = pd.DataFrame({"edit_success": [4.0, 3.99, None, 5.0],
                          "race_change": [3.0, 2.0, 4.0, None]})
    added = paper_tables.with_score_outcomes(frame)
    assert added["edit_success_ge4"].tolist() == [True, False, pd.NA, True]
    assert added["race_change_ge3"].tolist() == [True, False, True, pd.NA]
    assert added["race_change_ge4"].tolist() == [False, False, True, pd.NA]
    assert str(added["race_change_ge4"].dtype) == "boolean"
    # An axis the frame lacks adds nothing.
    only = paper_tables.with_score_outcomes(pd.DataFrame({"race_change": [5.0]}))
    assert "edit_success_ge4" not in only and "race_change_ge4" in only
    assert paper_tables.scored(frame, "race_change")
    assert not paper_tables.scored(pd.DataFrame({"race_change": [None, None]}), "race_change")
    assert not paper_tables.scored(frame, "skin_tone")


def test_table_1_age_axes_are_the_scored_ones_and_an_unscored_axis_is_empty() -> None:
    both = {"a": pd.DataFrame({"age_direction": [3.0], "age_change": [None]}),
            "b": pd.DataFrame({"age_direction": [None], "age_change": [2.0]})}
    assert paper_tables.table1_axes(both) == (*paper_tables.MEAN_AXES[:4], "age_direction",
                                              "age_change")
    assert paper_tables.table1_axes({"a": pd.DataFrame({"x": [1]})}) == \
        paper_tables.MEAN_AXES
    frame = _small_frame({"edit_success": [4, 2], "skin_tone": [None, None]},
                         ["Black", "White"])
    table = paper_tables.judge_means({MODEL: frame}, SETTINGS,
                                     axes=["edit_success", "skin_tone"])
    assert list(table.columns) == list(paper_tables.JUDGE_MEANS_COLUMNS)
    row = table.set_index("axis").loc["edit_success"]
    assert (row["n"], row["n_sources"], row["mean"]) == (2, 2, pytest.approx(3.0))
    assert row["low"] < 3.0 < row["high"] and row["confidence"] == 0.95
    assert row["definition"] == paper_tables.DEFINITIONS["edit_success"]
    empty = table.set_index("axis").loc["skin_tone"]
    assert (empty["n"], empty["n_sources"]) == (0, 0)
    assert math.isnan(empty["mean"]) and math.isnan(empty["low"]) and math.isnan(empty["high"])


def test_race_rates_count_sources_and_requests_and_skip_what_is_absent() -> None:
    # Three sources: two Black (one answering both prompts), one White.
    frame = _small_frame({"race_change": [4, 1, 5, 2]}, ["Black", "White", "Black", "Black"])
    frame.loc[3, "source_id"] = "s0"
    table = paper_tables.race_rates({MODEL: frame}, SETTINGS,
                                    outcomes=["race_change_ge4", "judge_lightening"])
    assert list(table.columns) == list(paper_tables.RACE_RATE_COLUMNS)
    assert set(table["outcome"]) == {"race_change_ge4"}  # no lightening column: left out
    black = table.set_index("race").loc["Black"]
    assert (black["n_sources"], black["n"], black["k"]) == (2, 3, 2)
    assert black["rate"] == pytest.approx(2 / 3) and black["confidence"] == 0.95
    assert black["low"] < 2 / 3 < black["high"]
    assert list(table["race"]) == [r for r in paper_tables.RACES if r in {"Black", "White"}]
    empty = paper_tables.race_rates({MODEL: frame}, SETTINGS, outcomes=["judge_lightening"])
    assert empty.empty and list(empty.columns) == list(paper_tables.RACE_RATE_COLUMNS)


def test_table_3_without_a_measure_has_an_empty_cell_and_one_definition_sentence() -> None:
    frame = _small_frame({"edit_success": [5, 4, 1, 2]}, ["Black", "White"] * 2)
    table = paper_tables.model_summary({MODEL: frame}, SETTINGS,
                                       measures=[("edit_success_ge4", "rate"),
                                                 ("soft_erasure", "rate")]).iloc[0]
    assert table["edit_success_ge4"] == pytest.approx(0.5) and table["edit_success_ge4_n"] == 4
    assert table["soft_erasure_n"] == 0 and math.isnan(table["soft_erasure"])
    assert math.isnan(table["soft_erasure_low"]) and math.isnan(table["soft_erasure_high"])
    assert table["definition"] == (
        f"edit_success_ge4: {paper_tables.DEFINITIONS['edit_success_ge4']}; soft_erasure: "
        f"{paper_tables.definition('soft_erasure')}")
    assert table["confidence"] == 0.95


def _gap_frame() -> pd.DataFrame:
    """Eight sources, four Black and four White, two prompts each: race change >= 4 for 7 of
    8 Black requests and 1 of 8 White ones."""
    races = ["Black", "White"] * 8
    scores = [5, 1, 4, 1, 5, 2, 4, 1, 5, 1, 4, 5, 5, 1, 1, 1]
    frame = _small_frame({"race_change": scores}, races)
    frame["source_id"] = [f"s{i % 8}" for i in range(16)]
    frame["prompt_id"] = [f"P{i // 8}" for i in range(16)]
    return frame


def test_table_4_rows_name_their_races_gap_and_test() -> None:
    frame = _gap_frame()
    one_race = frame[frame["race"] == "Black"]
    table = paper_tables.race_gap({MODEL: frame, "only-black": one_race}, SETTINGS,
                                  outcomes=["race_change_ge4"])
    assert list(table.columns) == ["model", "outcome", "Black", "White", "gap",
                                   "gap_corrected", "low", "high", "max_race", "min_race",
                                   "p_value", "n", "confidence", "definition"]
    row = table.set_index("model").loc[MODEL]
    assert (row["Black"], row["White"]) == pytest.approx((7 / 8, 1 / 8))
    assert row["gap"] == pytest.approx(6 / 8)
    assert (row["max_race"], row["min_race"], row["n"]) == ("Black", "White", 16)
    assert row["gap_corrected"] <= row["gap"] and row["low"] <= row["gap"] <= row["high"]
    assert 0 < row["p_value"] < 0.2 and row["confidence"] == 0.95
    assert row["definition"] == paper_tables.DEFINITIONS["race_change_ge4"]
    lone = table.set_index("model").loc["only-black"]
    assert lone["Black"] == pytest.approx(7 / 8) and math.isnan(lone["White"])
    shown = paper_tables.SPECS["race_gap"].display(table)
    assert shown.header == ["Model", "Outcome", "Black", "White", "Gap (pp)",
                            "Corrected gap (pp)", "p"]
    assert shown.align == "llccccr"
    cells = dict(zip(shown.header, shown.rows[0], strict=True))
    assert cells["Corrected gap (pp)"] == paper_tables.fmt_pct(row["gap_corrected"])
    assert cells["p"] == paper_tables.fmt_p(row["p_value"])
    assert cells["Gap (pp)"] == paper_tables.fmt_pct(row["gap"], row["low"], row["high"])
    assert cells["Outcome"] == "Race change >= 4" and cells["Model"] == MODEL
    assert "95% interval" in shown.caption and "Race change >= 4: share" in shown.caption


def test_table_4_joint_bands_widen_with_the_models_of_an_outcome() -> None:
    frame = _gap_frame()
    joint = paper_tables.Resampling(n_boot=200, n_perm=50, simultaneous=True)
    alone = paper_tables.race_gap({MODEL: frame}, joint, outcomes=["race_change_ge4"]).iloc[0]
    pair = paper_tables.race_gap({MODEL: frame, "twin": frame.copy()}, joint,
                                 outcomes=["race_change_ge4"]).iloc[0]
    per_row = paper_tables.race_gap({MODEL: frame}, paper_tables.Resampling(
        n_boot=200, n_perm=50), outcomes=["race_change_ge4"]).iloc[0]
    # Bonferroni over two models: a wider band than over one, from the same resamples.
    assert pair["high"] - pair["low"] > alone["high"] - alone["low"]
    assert (alone["low"], alone["high"]) != pytest.approx((per_row["low"], per_row["high"]))
    # The row test and the gap do not depend on the interval method.
    assert alone["p_value"] == per_row["p_value"] and alone["gap"] == per_row["gap"]


def test_table_4_seeds_are_per_model_and_outcome() -> None:
    frame = _gap_frame()
    both = paper_tables.race_gap({MODEL: frame, "twin": frame.copy()}, SETTINGS,
                                 outcomes=["race_change_ge3", "race_change_ge4"])
    alone = paper_tables.race_gap({"twin": frame.copy()}, SETTINGS,
                                  outcomes=["race_change_ge4"])
    first = both[(both["model"] == MODEL) & (both["outcome"] == "race_change_ge4")].iloc[0]
    twin = both[(both["model"] == "twin") & (both["outcome"] == "race_change_ge4")].iloc[0]
    # The same data under another model's seed draws other permutations...
    assert first["p_value"] != twin["p_value"]
    # ...and a model's numbers are the same whatever comes before it, once in the same place.
    lone_first = paper_tables.race_gap({MODEL: frame}, SETTINGS,
                                       outcomes=["race_change_ge3", "race_change_ge4"])
    assert lone_first.iloc[1]["p_value"] == first["p_value"]
    assert alone.iloc[0]["p_value"] == paper_tables.race_gap(
        {"twin": frame.copy()}, SETTINGS, outcomes=["race_change_ge4"]).iloc[0]["p_value"]


def _arms() -> tuple[pd.DataFrame, pd.DataFrame]:
    base = {"model": MODEL, "outcome": "soft_erasure", "confidence": 0.9}
    groups = pd.DataFrame([
        {**base, "dimension": "race", "group": "Black", "n_pairs": 10, "rate_none": 0.4,
         "rate_feature": 0.3, "change": -0.1, "low": -0.2, "high": 0.05},
        {**base, "dimension": "race", "group": "White", "n_pairs": 12, "rate_none": 0.1,
         "rate_feature": 0.15, "change": 0.05, "low": -0.02, "high": 0.12},
        {**base, "dimension": "gender", "group": "Male", "n_pairs": 22, "rate_none": 0.2,
         "rate_feature": 0.2, "change": 0.0, "low": -0.1, "high": 0.1}])
    gap = pd.DataFrame([
        {**base, "dimension": "race", "delta_none": 0.3, "delta_feature": 0.15,
         "narrowing": 0.15, "low": 0.02, "high": 0.25, "p_value": 0.03},
        {**base, "dimension": "gender", "delta_none": 0.0, "delta_feature": 0.0,
         "narrowing": 0.0, "low": -0.1, "high": 0.1, "p_value": 0.9}])
    return groups, gap


def test_table_5_carries_the_arms_rates_and_the_gap_row_negated() -> None:
    groups, gap = _arms()
    table = paper_tables.feature_mitigation(groups, gap)
    assert list(table.columns) == list(paper_tables.FEATURE_COLUMNS)
    assert list(table["group"]) == ["Black", "White", paper_tables.GAP_ROW]
    black = table.iloc[0]
    assert [black[c] for c in ("n_pairs", "rate_none", "rate_feature", "change", "low",
                               "high", "confidence")] == [10, 0.4, 0.3, -0.1, -0.2, 0.05, 0.9]
    assert math.isnan(black["narrowing"]) and math.isnan(black["p_value"])
    assert black["definition"] == paper_tables.FEATURE_RATE_DEFINITION
    assert (black["model"], black["outcome"]) == (MODEL, "soft_erasure")
    row = table.iloc[2]
    assert row["n_pairs"] == 22 and (row["rate_none"], row["rate_feature"]) == (0.3, 0.15)
    assert row["change"] == pytest.approx(-0.15)
    assert (row["low"], row["high"]) == (-0.25, -0.02)
    assert (row["narrowing"], row["p_value"], row["confidence"]) == (0.15, 0.03, 0.9)
    assert row["definition"] == paper_tables.FEATURE_GAP_DEFINITION
    by_gender = paper_tables.feature_mitigation(groups, gap, dimension="gender")
    assert list(by_gender["group"]) == ["Male", paper_tables.GAP_ROW]
    with pytest.raises(Exception, match="narrowing"):
        paper_tables.feature_mitigation(groups, gap.drop(columns="narrowing"))
    with pytest.raises(Exception, match="n_pairs"):
        paper_tables.feature_mitigation(groups.drop(columns="n_pairs"), gap)
    shown = paper_tables.SPECS["feature_mitigation"].display(table)
    assert shown.header == ["Model", "Outcome", "Race", "None (%)", "Feature (%)",
                            "Change (pp)", "p"]
    assert shown.align == "lllcccr"
    assert shown.rows[0] == [MODEL, "soft erasure", "Black", "40.0", "30.0",
                             "-10.0 [-20.0, 5.0]", "--"]
    assert shown.rows[2] == [MODEL, "soft erasure", paper_tables.GAP_ROW, "30.0", "15.0",
                             "-15.0 [-25.0, -2.0]", "0.030"]
    assert "90% source-clustered" in shown.caption


def test_table_6_lists_skipped_editors_with_their_reason() -> None:
    rows = pd.DataFrame([{"model": MODEL, "role_coding": "male", "n": 10, "following": 7,
                          "rate": 0.7, "low": 0.4, "high": 0.9, "p_value": 0.2,
                          "abstained": 2, "confidence": 0.9}])
    skipped = pd.DataFrame({"model": ["gone"], "reason": ["no WinoBias prompts"]})
    table = paper_tables.winobias(rows, skipped)
    assert list(table.columns) == [*paper_tables.WINOBIAS_COLUMNS, "definition"]
    assert list(table["model"]) == [MODEL, "gone"]
    assert table.iloc[1]["note"] == "not run: no WinoBias prompts"
    assert table.iloc[1]["role_coding"] == "" and table.iloc[0]["note"] == ""
    assert table.iloc[0]["definition"] == ""
    shown = paper_tables.SPECS["winobias"].display(table)
    assert shown.header == ["Model", "Role", "Following", "Followed (%)", "Resisted (%)", "p",
                            "Note"]
    assert shown.align == "llrccrl"
    assert shown.rows[0] == [MODEL, "male", "7/10", "70.0 [40.0, 90.0]", "30.0", "0.200",
                             "2 abstained"]
    assert shown.rows[1] == ["gone", "--", "--", "--", "--", "--",
                             "not run: no WinoBias prompts"]
    assert "90% interval" in shown.caption
    assert "Definitions" not in shown.caption
    assert len(paper_tables.winobias(rows, skipped.iloc[:0])) == 1
    assert len(paper_tables.winobias(rows, None)) == 1
    with pytest.raises(Exception, match="reason"):
        paper_tables.winobias(rows, skipped.drop(columns="reason"))
    with pytest.raises(Exception, match="abstained"):
        paper_tables.winobias(rows.drop(columns="abstained"), None)
    # The paper's row goes first within its own model only.
    two = pd.concat([rows.assign(model="a"), rows.assign(model="b"),
                     rows.assign(model="b", role_coding="stereotype")], ignore_index=True)
    assert list(zip(*[paper_tables.winobias(two, None)[c] for c in ("model", "role_coding")],
                    strict=True)) == [("a", "male"), ("b", "stereotype"), ("b", "male")]
    missing = rows.assign(rate=math.nan, abstained=math.nan)
    shown = paper_tables.SPECS["winobias"].display(paper_tables.winobias(missing, None))
    assert shown.rows[0][3:] == ["--", "--", "0.200", ""]


def test_table_9_says_which_side_is_empty_and_leaves_out_unscored_axes() -> None:
    frames = {"no-white": _small_frame({"skin_tone": [4, 5]}, ["Black", "Indian"]),
              "only-white": _small_frame({"skin_tone": [3, 4]}, ["White", "White"]),
              "no-skin": _small_frame({"race_change": [1, 2]}, ["White", "Black"])}
    table = paper_tables.white_vs_nonwhite(frames, axes=["skin_tone", "race_change",
                                                          "gender_change"])
    assert set(table["axis"]) == {"skin_tone", "race_change"}  # nobody scored gender_change
    cells = table.set_index(["model", "axis"])
    row = cells.loc[("no-white", "skin_tone")]
    assert row["note"] == "no scored request of a White source"
    assert (row["n_white"], row["n_other"]) == (0, 2) and math.isnan(row["mean_white"])
    assert row["mean_other"] == pytest.approx(4.5)
    assert math.isnan(row["u"]) and math.isnan(row["p_value"]) and math.isnan(row["p_holm"])
    row = cells.loc[("only-white", "skin_tone")]
    assert row["note"] == "no scored request of another source" and math.isnan(row["mean_other"])
    assert row["mean_white"] == pytest.approx(3.5)
    # A model without the axis scored has both sides empty.
    row = cells.loc[("no-skin", "skin_tone")]
    assert (row["n_white"], row["n_other"]) == (0, 0)
    row = cells.loc[("no-skin", "race_change")]
    assert row["note"] == "" and row["u"] == pytest.approx(0.0)
    assert row["p_value"] == pytest.approx(1.0) and row["p_holm"] == pytest.approx(1.0)
    assert row["definition"] == ("paper: Mann-Whitney U (two-sided) of the ensemble "
                                 "race_change scores of White sources against all other "
                                 "sources; outputs counted as independent")
    # A request that failed (no answer) is not a score.
    refused = _small_frame({"skin_tone": [5, 1, 3]}, ["White", "Black", "Black"],
                           status=["ok", "ok", "error"])
    one = paper_tables.white_vs_nonwhite({MODEL: refused}, axes=["skin_tone"]).iloc[0]
    assert (one["n_white"], one["n_other"], one["mean_other"]) == (1, 1, 1.0)
    shown = paper_tables.SPECS["white_vs_nonwhite"].display(table)
    assert shown.header == ["Model", "Axis", "n White", "n other", "Mean White", "Mean other",
                            "U", "p", "p Holm"]
    assert shown.align == "llrrccrrr"
    first = table.iloc[0]
    assert shown.rows[0] == [first["model"], paper_tables.AXIS_LABELS[first["axis"]],
                             str(first["n_white"]), str(first["n_other"]), "--", "4.50", "--",
                             "--", "--"]


def _review_rows() -> pd.DataFrame:
    def row(dimension: str, group: str, axis: str, n: int, diff: float) -> dict:
        return {"axis": axis, "dimension": dimension, "group": group, "n": n,
                "weighted_kappa": 0.5, "spearman": 0.6, "spearman_p": 0.01,
                "mean_difference": diff, "ci_low": diff - 0.1, "ci_high": diff + 0.1}
    return pd.DataFrame([row("model", "b", "skin_tone", 3, 0.25),
                         row("race", "Black", "skin_tone", 2, 9.0),
                         row("all", "all", "skin_tone", 5, 0.5),
                         row("model", "a", "skin_tone", 2, 1.0)])


def test_judge_means_reproduce_the_review_only_on_the_same_units() -> None:
    means = pd.DataFrame({"model": ["a", "b", "all"], "axis": "skin_tone", "n": [2, 3, 5],
                          "judge_mean": [4.0, 3.25, 3.5], "human_mean": [3.0, 3.0, 3.0]})
    review = _review_rows()
    assert paper_tables.means_reproduce(review, means)
    assert not paper_tables.means_reproduce(review, means.assign(n=[2, 4, 5]))
    assert not paper_tables.means_reproduce(review[review["group"] != "b"], means)
    assert not paper_tables.means_reproduce(review[review["dimension"] != "all"], means)
    off = means.assign(judge_mean=[4.0 + 1e-6, 3.25, 3.5])
    assert not paper_tables.means_reproduce(review, off)
    assert paper_tables.means_reproduce(review, off, tolerance=1e-5)
    # No score on either side: NaN on both sides agrees, NaN on one does not.
    empty = means.assign(judge_mean=[math.nan, 3.25, 3.5])
    assert not paper_tables.means_reproduce(review, empty)
    nan_review = review.assign(mean_difference=[0.25, 9.0, 0.5, math.nan])
    assert paper_tables.means_reproduce(nan_review, empty)
    assert not paper_tables.means_reproduce(nan_review, means)


def test_table_7_rows_are_per_model_then_overall_with_peoples_alpha_of_edited_outputs() -> None:
    review = _review_rows()
    means = pd.DataFrame({"model": ["a", "b", "all"], "axis": "skin_tone", "n": [2, 3, 5],
                          "judge_mean": [4.0, 3.25, 3.5], "human_mean": [3.0, 3.0, 3.0]})
    alpha = pd.DataFrame([
        {"axis": "skin_tone", "dimension": "all", "statistic": s, "arm": arm,
         "estimate": e, "ci_low": e - 0.1, "ci_high": e + 0.1}
        for s, arm, e in (("alpha_ordinal", "edited", 0.71), ("alpha_interval", "edited", 0.66),
                          ("alpha_ordinal", "source", 0.11), ("alpha_interval", "source", 0.12))
    ] + [{"axis": "skin_tone", "dimension": "race", "statistic": "alpha_ordinal",
          "arm": "edited", "estimate": 0.01, "ci_low": 0.0, "ci_high": 0.02}])
    table = paper_tables.judge_human(review, alpha, means, "median")
    assert list(table["model"]) == ["a", "b", "all"]  # the race row is not table 7's
    assert list(table.columns) == list(paper_tables.JUDGE_HUMAN_COLUMNS)
    a = table.iloc[0]
    assert [a[c] for c in ("n", "weighted_kappa", "spearman", "spearman_p", "mean_difference",
                           "judge_mean", "human_mean", "consensus")] == \
        [2, 0.5, 0.6, 0.01, 1.0, 4.0, 3.0, "median"]
    assert (a["low"], a["high"]) == pytest.approx((0.9, 1.1))
    assert math.isnan(a["human_alpha"]) and math.isnan(a["human_alpha_interval"])
    overall = table.iloc[2]
    assert (overall["human_alpha"], overall["human_alpha_interval"]) == (0.71, 0.66)
    assert (overall["human_alpha_low"], overall["human_alpha_high"]) == pytest.approx((0.61, 0.81))
    assert (overall["human_alpha_interval_low"], overall["human_alpha_interval_high"]) == \
        pytest.approx((0.56, 0.76))
    # Without an arm column every overall row is the people's; without ratings, NaN.
    plain = paper_tables.judge_human(review, alpha[alpha["arm"] == "source"].drop(
        columns="arm"), means)
    assert plain.iloc[2]["human_alpha"] == 0.11 and plain.iloc[2]["consensus"] == ""
    only_source = paper_tables.judge_human(review, alpha[alpha["arm"] == "source"], means)
    assert only_source.iloc[2]["human_alpha_interval"] == 0.12
    none = paper_tables.judge_human(review, None, None)
    assert none["judge_mean"].isna().all() and none["human_alpha"].isna().all()
    assert paper_tables.judge_human(review, alpha.iloc[:0], means)["human_alpha"].isna().all()
    with pytest.raises(Exception, match="spearman_p"):
        paper_tables.judge_human(review.drop(columns="spearman_p"), None)
    shown = paper_tables.SPECS["judge_human"].display(table)
    assert shown.align == "llrcccrrcc"
    assert shown.rows[2][:3] == ["all", "Skin tone", "5"]
    assert shown.rows[2][-2:] == ["0.66 [0.56, 0.76]", "0.71 [0.61, 0.81]"]
    assert shown.rows[0][5] == "1.00 [0.90, 1.10]"
    assert ("the median of an output's ratings (the review stage's review.consensus), "
            "rounded half to even") in shown.caption
    assert "as the review stage made it" in paper_tables.SPECS["judge_human"].display(
        none).caption


def test_tables_1_2_and_8_show_empty_cells_their_level_and_definitions() -> None:
    means = pd.DataFrame([
        {"model": "a", "axis": "edit_success", "mean": 3.5, "low": 3.0, "high": 4.0,
         "confidence": 0.9, "definition": "ES def"},
        {"model": "a", "axis": "skin_tone", "mean": 3.25, "low": math.nan, "high": math.nan,
         "confidence": 0.9, "definition": ""},
        {"model": "b", "axis": "edit_success", "mean": 2.0, "low": 1.5, "high": 2.5,
         "confidence": 0.9, "definition": "ES def"}])
    shown = paper_tables.SPECS["judge_means"].display(means)
    assert shown.header == ["Model", "Edit success", "Skin tone"]
    assert shown.rows == [["a", "3.50 [3.00, 4.00]", "3.25"], ["b", "2.00 [1.50, 2.50]", "--"]]
    assert shown.align == "lcc"
    assert "with 90% clustered intervals. Definitions: Edit success: ES def." in shown.caption
    rates = pd.DataFrame([
        {"model": "a", "outcome": "race_change_ge3", "race": "White", "rate": 0.25, "low": 0.1,
         "high": 0.5, "confidence": 0.95, "definition": "at 3"},
        {"model": "a", "outcome": "race_change_ge3", "race": "Black", "rate": 0.5, "low": 0.2,
         "high": 0.8, "confidence": 0.95, "definition": "at 3"},
        {"model": "b", "outcome": "race_change_ge3", "race": "Black", "rate": 0.0, "low": 0.0,
         "high": 0.3, "confidence": 0.95, "definition": "at 3"}])
    shown = paper_tables.SPECS["race_rates"].display(rates)
    assert shown.header == ["Race", "a: Race change >= 3 (%)", "b: Race change >= 3 (%)"]
    order = [r for r in paper_tables.RACES if r in {"Black", "White"}]
    assert [r[0] for r in shown.rows] == order
    white = shown.rows[order.index("White")]
    assert white == ["White", "25.0 [10.0, 50.0]", "--"]
    assert shown.rows[order.index("Black")][2] == "0.0 [0.0, 30.0]"
    assert shown.align == "lcc"
    assert "with 95% clustered intervals. Definitions: Race change >= 3: at 3." in shown.caption
    scores = pd.DataFrame([
        {"model": "a", "axis": "race_change", "race": "all", "change": -0.5, "low": -0.75,
         "high": -0.25, "confidence": 0.8},
        {"model": "a", "axis": "race_change", "race": "Black", "change": -1.0, "low": -2.0,
         "high": 0.0, "confidence": 0.8},
        {"model": "a", "axis": "skin_tone", "race": "all", "change": 0.25, "low": 0.0,
         "high": 0.5, "confidence": 0.8}])
    shown = paper_tables.SPECS["feature_scores"].display(scores)
    assert shown.header == ["Model", "Race", "Race change change", "Skin tone change"]
    assert shown.rows == [["a", "all", "-0.50 [-0.75, -0.25]", "0.25 [0.00, 0.50]"],
                          ["a", "Black", "-1.00 [-2.00, 0.00]", "--"]]
    assert shown.align == "llcc" and "with 80% two-way" in shown.caption
    # No confidence column: no level is claimed.
    assert "with  clustered" in paper_tables.SPECS["judge_means"].display(
        means.drop(columns="confidence")).caption


def test_table_3_is_shown_with_the_columns_it_has_and_its_definitions() -> None:
    frame = pd.DataFrame([{"model": "a", "confidence": 0.9, "definition": "the words",
                           "edit_success": 3.456, "edit_success_low": 3.0,
                           "edit_success_high": 3.9, "race_change_ge4": 0.125,
                           "race_change_ge4_low": 0.05, "race_change_ge4_high": 0.3}])
    shown = paper_tables.SPECS["model_summary"].display(frame)
    assert shown.header == ["Model", "Edit success (mean, 1-5)", "Race change >= 4 (%)"]
    assert shown.rows == [["a", "3.46 [3.00, 3.90]", "12.5 [5.0, 30.0]"]]
    assert shown.align == "lcc"
    assert shown.caption.endswith("with 90% clustered intervals. Definitions: the words.")
    bare = paper_tables.SPECS["model_summary"].display(frame.assign(definition=math.nan))
    assert bare.caption.endswith("with 90% clustered intervals.")
    assert paper_tables.SPECS["model_summary"].display(frame.iloc[:0]).rows == []


def test_table_1_and_3_numbers_are_the_pooled_clustered_estimates() -> None:
    frame = _small_frame({"edit_success": [5, 4, 2, 1, 3, 3]},
                         ["Black", "White", "Black", "White", "Black", "White"])
    frame["source_id"] = ["s0", "s1", "s2", "s0", "s1", "s2"]
    frame["prompt_id"] = ["P0", "P0", "P0", "P1", "P1", "P1"]
    one = paper_tables.judge_means({MODEL: frame}, SETTINGS, axes=["edit_success"]).iloc[0]
    est = paper_tables.pooled_estimate(frame, "edit_success", SETTINGS, "mean")
    assert (one["n"], one["n_sources"]) == (6, 3) == (est["n"], est["n_sources"])
    assert (one["mean"], one["low"], one["high"]) == pytest.approx(
        (est["estimate"], est["low"], est["high"]))
    summary = paper_tables.model_summary({MODEL: frame}, SETTINGS).iloc[0]
    assert (summary["edit_success"], summary["edit_success_low"],
            summary["edit_success_high"]) == pytest.approx(
        (est["estimate"], est["low"], est["high"]))
    assert summary["edit_success_ge4_n"] == 6 and summary["edit_success_ge4"] == pytest.approx(
        2 / 6)
    rate = paper_tables.pooled_estimate(paper_tables.with_score_outcomes(frame),
                                        "edit_success_ge4", SETTINGS, "rate")
    assert (summary["edit_success_ge4_low"], summary["edit_success_ge4_high"]) == \
        pytest.approx((rate["low"], rate["high"]))
    assert rate["low"] != pytest.approx(paper_tables.pooled_estimate(
        paper_tables.with_score_outcomes(frame), "edit_success_ge4", SETTINGS, "mean")["low"])


def test_table_5_keeps_the_files_model_order_and_each_models_own_gap() -> None:
    groups, gap = _arms()
    later = groups.assign(model="a-model", rate_none=groups["rate_none"] / 2)
    table = paper_tables.feature_mitigation(
        pd.concat([groups, later], ignore_index=True),
        pd.concat([gap, gap.assign(model="a-model", delta_none=0.9)], ignore_index=True))
    # The file's order (MODEL, then a-model), not the alphabet's.
    assert list(table["model"]) == [MODEL] * 3 + ["a-model"] * 3
    gaps = table[table["group"] == paper_tables.GAP_ROW].set_index("model")
    assert list(gaps.index) == [MODEL, "a-model"]  # one gap row each, its own
    assert gaps.loc["a-model", "rate_none"] == 0.9 and gaps.loc[MODEL, "rate_none"] == 0.3
    empty = paper_tables.feature_mitigation(groups, gap, dimension="age")
    assert empty.empty and list(empty.columns) == list(paper_tables.FEATURE_COLUMNS)


def _winobias_rows(index: list[int]) -> pd.DataFrame:
    """Three WinoBias rates, model b's paper row last, with the row labels ``index``."""
    base = {"n": 10, "following": 7, "rate": 0.7, "low": 0.4, "high": 0.9, "p_value": 0.2,
            "abstained": 0, "confidence": 0.95}
    return pd.DataFrame([{"model": "b", "role_coding": "male", **base},
                         {"model": "a", "role_coding": "female", **base},
                         {"model": "b", "role_coding": "stereotype", **base}], index=index)


def test_table_6_definitions_and_index_whatever_the_files_index() -> None:
    rows = _winobias_rows([7, 3, 5])
    table = paper_tables.winobias(rows, pd.DataFrame({"model": ["c"], "reason": ["off"]}))
    assert list(zip(table["model"], table["role_coding"], strict=True)) == [
        ("b", "stereotype"), ("b", "male"), ("a", "female"), ("c", "")]
    assert list(table.index) == [0, 1, 2, 3]
    assert list(table["definition"]) == ["", "", "", ""]  # no definition column: all ""
    said = rows.assign(definition=[None, "per coding", "pooled"])
    table = paper_tables.winobias(said, pd.DataFrame({"model": ["c"], "reason": ["off"]}))
    assert list(table["definition"]) == ["pooled", "", "per coding", ""]


def test_judge_human_means_without_axes_keeps_its_columns() -> None:
    means = paper_tables.judge_human_means(_units(), [])
    assert means.empty and list(means.columns) == ["model", "axis", "n", "judge_mean",
                                                   "human_mean"]


#: Each table's caption for a one-row frame at 95%, word for word: the caption is what says
#: what the numbers are (and, for table 9, that they are not to be trusted).
CAPTIONS = {
    "judge_means": "Mean judge ensemble score per axis (1-5) over answered plain-arm requests, "
                   "with 95% clustered intervals.",
    "race_rates": "Judged skin lightening and race change rates (%) per source race and model, "
                  "with 95% clustered intervals.",
    "model_summary": "Edit success (the paper's share of edits judged successful, and ACRB's "
                     "mean score), soft erasure and race change rates (%) per model, with 95% "
                     "clustered intervals.",
    "race_gap": "Race change rate (%) by source race per model and threshold; gap = max - min "
                "over races with the 95% interval of the gap (cluster bootstrap), the "
                "bias-corrected gap (max - min of estimated rates overstates the gap, most when "
                "the races are equal) and the permutation p-value.",
    "feature_mitigation": "Feature-prompt mitigation per race, ACRB's reading in rates: rates "
                          "(%) without and with the feature prompt on the same requests, and "
                          "the change (feature - none, pp) with its 95% source-clustered "
                          "interval; on the gap row a negative change means the feature prompt "
                          "narrows the gap between races. The paper's reading, in score points, "
                          "is table 8.",
    "feature_scores": "Feature-prompt mitigation per race in score points (the paper's table): "
                      "mean ensemble score with the feature prompt minus without, on the same "
                      "(source, prompt, seed) pairs, per axis (1-5 scale), with 95% two-way "
                      "clustered t intervals; on race change, a negative change means less "
                      "change. ACRB's reading in rates is table 5.",
    "white_vs_nonwhite": "White against all other sources per model and axis, as the paper "
                         "tests it: Mann-Whitney U (two-sided) of the ensemble scores of "
                         "answered plain-arm requests, U of the White sample, p and "
                         "Holm-adjusted p over this table's tests. The test treats outputs as "
                         "independent, as the study did; they are not (one face answers every "
                         "prompt), so its p-values are too small: ACRB's clustered tests "
                         "(table 4, the report) are the ones to trust.",
    "winobias": "WinoBias: stereotype-following rate (%) per model, over both role codings (the "
                "paper's single rate, where the WinoBias analysis wrote it) and per role "
                "coding, with its 95% interval, the share that resisted the stereotype and the "
                "p-value against 50%.",
    "judge_human": "Judges against people on the random review sample, per model and over all "
                   "models (all): the judges' mean ensemble score and people's mean consensus "
                   "score on the same outputs (1-5; the paper's table; people's consensus: the "
                   "mean of an output's ratings (the review stage's review.consensus), rounded "
                   "half to even), and ACRB's agreement: mean difference judge - human (scale "
                   "steps, 95% t interval), quadratic-weighted kappa, Spearman's rho and "
                   "people's own agreement on the edited outputs: Krippendorff's interval alpha "
                   "(the paper's) and ordinal alpha (ACRB's reading of a 1-5 rating).",
}


def _one_row_frames() -> dict[str, pd.DataFrame]:
    at = {"confidence": 0.95}
    human = pd.DataFrame([{c: math.nan for c in paper_tables.JUDGE_HUMAN_COLUMNS}])
    return {
        "judge_means": pd.DataFrame([{"model": "m", "axis": "edit_success", "mean": 3.0,
                                      "low": 2.0, "high": 4.0, **at, "definition": ""}]),
        "race_rates": pd.DataFrame([{"model": "m", "outcome": "race_change_ge3",
                                     "race": "Black", "rate": 0.1, "low": 0.0, "high": 0.2,
                                     **at, "definition": ""}]),
        "model_summary": pd.DataFrame([{"model": "m", **at, "definition": "",
                                        "edit_success": 3.0, "edit_success_low": 2.0,
                                        "edit_success_high": 4.0}]),
        "race_gap": pd.DataFrame([{"model": "m", "outcome": "race_change_ge3", "Black": 0.1,
                                   "gap": 0.1, "low": 0.0, "high": 0.2, "gap_corrected": 0.05,
                                   "p_value": 0.5, **at, "definition": ""}]),
        "feature_mitigation": pd.DataFrame([{"model": "m", "outcome": "soft_erasure",
                                             "group": "Black", "rate_none": 0.1,
                                             "rate_feature": 0.2, "change": 0.1, "low": 0.0,
                                             "high": 0.2, "p_value": math.nan, **at}]),
        "feature_scores": pd.DataFrame([{"model": "m", "axis": "skin_tone", "race": "all",
                                         "change": 0.1, "low": 0.0, "high": 0.2, **at}]),
        "white_vs_nonwhite": pd.DataFrame([{"model": "m", "axis": "skin_tone", "n_white": 1,
                                            "n_other": 1, "mean_white": 3.0, "mean_other": 4.0,
                                            "u": 0.0, "p_value": 1.0, "p_holm": 1.0}]),
        "winobias": pd.DataFrame([{"model": "m", "role_coding": "male", "n": 2, "following": 1,
                                   "rate": 0.5, "low": 0.1, "high": 0.9, "p_value": 1.0,
                                   "abstained": 0, **at, "note": "", "definition": ""}]),
        "judge_human": human.assign(model="m", axis="skin_tone", consensus="mean"),
    }


def test_every_caption_says_what_its_numbers_are_word_for_word() -> None:
    frames = _one_row_frames()
    assert set(frames) == set(CAPTIONS) == set(paper_tables.SPECS)
    for table, frame in frames.items():
        assert paper_tables.SPECS[table].display(frame).caption == CAPTIONS[table], table
    human = paper_tables.SPECS["judge_human"].display(frames["judge_human"])
    assert human.header == ["Model", "Axis", "n", "Judges' mean", "People's mean",
                            "Judge - human", "Weighted kappa", "Spearman",
                            "Human alpha (interval)", "Human alpha (ordinal)"]
    # Without the consensus column (an older CSV) the rule is not named.
    bare = paper_tables.SPECS["judge_human"].display(frames["judge_human"].drop(
        columns="consensus")).caption
    assert "people's consensus: as the review stage made it)" in bare
    # Without a definition column table 6 claims none.
    plain = paper_tables.SPECS["winobias"].display(frames["winobias"].drop(columns="definition"))
    assert plain.caption == CAPTIONS["winobias"]


def test_captions_join_every_definition_and_skip_the_empty_ones() -> None:
    frame = pd.DataFrame({"axis": ["edit_success", "skin_tone", "race_change", "gender_change"],
                          "definition": ["one", "two", None, ""]})
    assert paper_tables._definitions(frame, "axis") == (
        " Definitions: Edit success: one; Skin tone: two.")
    assert paper_tables._definitions(frame.drop(columns="axis"), "axis") == ""
    assert paper_tables._definitions(frame.drop(columns="definition"), "axis") == ""
    assert paper_tables._definitions(frame.assign(definition=[None, "", None, ""]), "axis") == ""


def test_table_6_caption_keeps_a_role_codings_definition_over_an_empty_one() -> None:
    base = {"n": 10, "following": 7, "rate": 0.7, "low": 0.4, "high": 0.9, "p_value": 0.2,
            "abstained": 0, "confidence": 0.95, "note": ""}
    for empty in (None, ""):
        frame = pd.DataFrame([{"model": "a", "role_coding": "male", **base,
                               "definition": "male-coded roles"},
                              {"model": "b", "role_coding": "male", **base,
                               "definition": empty}])
        caption = paper_tables.SPECS["winobias"].display(frame).caption
        assert caption.endswith(" Definitions: Male: male-coded roles."), empty


def test_table_6_shows_rows_after_a_skipped_editor() -> None:
    frame = pd.DataFrame([
        {"model": "gone", "role_coding": "", "note": "not run: no prompts", "definition": "",
         "n": math.nan, "following": math.nan, "rate": math.nan, "low": math.nan,
         "high": math.nan, "p_value": math.nan, "abstained": math.nan, "confidence": 0.95},
        {"model": "m", "role_coding": "male", "note": "", "definition": "", "n": 4,
         "following": 1, "rate": 0.25, "low": 0.1, "high": 0.6, "p_value": 0.6,
         "abstained": 1, "confidence": 0.95}])
    shown = paper_tables.SPECS["winobias"].display(frame)
    assert [r[0] for r in shown.rows] == ["gone", "m"]
    assert shown.rows[1] == ["m", "male", "1/4", "25.0 [10.0, 60.0]", "75.0", "0.600",
                             "1 abstained"]


def test_table_9_cells_carry_both_p_values() -> None:
    frame = _one_row_frames()["white_vs_nonwhite"].assign(p_value=0.0123, p_holm=0.0456, u=7.0)
    shown = paper_tables.SPECS["white_vs_nonwhite"].display(frame)
    assert shown.rows[0][-3:] == ["7.0", "0.012", "0.046"]


def test_signed_zero_bounds_print_as_zero() -> None:
    assert paper_tables.fmt_pct(-0.0, -0.0, -0.0) == "0.0 [0.0, 0.0]"
    assert paper_tables.fmt_num(-0.0, -0.0, -0.0) == "0.00 [0.00, 0.00]"


def test_builders_keep_their_columns_when_there_is_nothing_to_show() -> None:
    assert list(paper_tables.judge_means({}, SETTINGS).columns) == list(
        paper_tables.JUDGE_MEANS_COLUMNS)
    assert list(paper_tables.model_summary({}, SETTINGS).columns) == \
        paper_tables.summary_columns()
    unscored = _small_frame({"skin_tone": [3, 4]}, ["Black", "White"])
    gap = paper_tables.race_gap({MODEL: unscored}, SETTINGS)
    assert gap.empty and list(gap.columns) == [
        "model", "outcome", "gap", "gap_corrected", "low", "high", "max_race", "min_race",
        "p_value", "n", "confidence", "definition"]
    arms = pd.concat([_small_frame({"skin_tone": [3, 4]}, ["Black", "White"], arm=arm)
                      for arm in ("none", "feature")])
    scores = paper_tables.feature_scores({MODEL: arms}, SETTINGS, axes=["race_change"])
    assert scores.empty and list(scores.columns) == list(paper_tables.FEATURE_SCORE_COLUMNS)
    mw = paper_tables.white_vs_nonwhite({MODEL: unscored}, axes=["race_change"])
    assert mw.empty and list(mw.columns) == list(paper_tables.MANN_WHITNEY_COLUMNS)


def test_race_rates_read_every_outcome_asked_for_with_its_definition_and_level() -> None:
    from acrb.analysis.estimation.resampling import prepare_block, rate_intervals
    from acrb.config import OutcomeRule
    frame = _gap_frame()
    frame["race_drift"] = pd.array(frame["race_change"] >= 2, dtype="boolean")
    rules = {"race_drift": OutcomeRule(axis="race_change", at_least=2)}
    at_80 = paper_tables.Resampling(confidence=0.8, n_boot=50, n_perm=50)
    table = paper_tables.race_rates({MODEL: frame}, at_80,
                                    outcomes=["judge_lightening", "race_drift",
                                              "race_change_ge4"], rules=rules)
    assert list(table["outcome"].unique()) == ["race_drift", "race_change_ge4"]
    assert list(table.index) == list(range(len(table)))
    for column in ("n_sources", "n", "k"):
        assert table[column].dtype == np.int64, column
    drift = table[table["outcome"] == "race_drift"]
    assert set(drift["definition"]) == {paper_tables.definition("race_drift", rules)}
    assert "race_change >= 2" in drift["definition"].iloc[0]
    low, high = rate_intervals(prepare_block(frame, "race_drift", "race"), 0.8)
    assert drift["low"].to_numpy() == pytest.approx(low)
    assert drift["high"].to_numpy() == pytest.approx(high)
    assert (drift["confidence"] == 0.8).all()
    summary = paper_tables.model_summary({MODEL: frame}, SETTINGS,
                                         measures=[("race_drift", "rate")], rules=rules)
    assert list(summary["model"]) == [MODEL]
    assert summary["definition"].iloc[0] == (
        f"race_drift: {paper_tables.definition('race_drift', rules)}")
    gap = paper_tables.race_gap({MODEL: frame}, SETTINGS, outcomes=["race_drift"], rules=rules)
    assert gap["definition"].iloc[0] == paper_tables.definition("race_drift", rules)


def _wide_gap_frame() -> pd.DataFrame:
    """8 sources x 6 prompts: race change >= 4 on about 3 in 4 Black and 1 in 4 White
    requests (enough prompts for every resampling to have some spread)."""
    count = 48
    source = [i % 8 for i in range(count)]
    prompt = [i // 8 for i in range(count)]
    races = ["Black" if s % 2 == 0 else "White" for s in source]
    scores = [5.0 if ((s * 7 + q * 3) % 4 != 0) == (s % 2 == 0) else 1.0
              for s, q in zip(source, prompt, strict=True)]
    frame = _small_frame({"race_change": scores}, races)
    frame["source_id"] = [f"s{s}" for s in source]
    frame["prompt_id"] = [f"P{q}" for q in prompt]
    return frame


def test_table_4_is_reproducible_and_its_bounds_are_rates() -> None:
    frame = _gap_frame()
    for settings in (SETTINGS, paper_tables.Resampling(n_boot=50, n_perm=50,
                                                       simultaneous=True)):
        for data in (frame, _wide_gap_frame()):
            first = paper_tables.race_gap({MODEL: data}, settings)
            again = paper_tables.race_gap({MODEL: data}, settings)
            pd.testing.assert_frame_equal(first, again)
            assert ((first["low"] >= 0) & (first["high"] <= 1)).all()
    # Two models with the same requests draw their bootstrap from their own seeds.
    twins = paper_tables.race_gap({MODEL: frame, "twin": frame.copy()}, SETTINGS,
                                  outcomes=["race_change_ge4"]).set_index("model")
    assert (twins.loc[MODEL, "low"], twins.loc[MODEL, "high"]) != pytest.approx(
        (twins.loc["twin", "low"], twins.loc["twin", "high"]))
    # And so do two outcomes with the same values (scores 1 or 5: >= 3 is >= 4).
    extreme = frame.assign(race_change=np.where(frame["race_change"] >= 3, 5.0, 1.0))
    rows = paper_tables.race_gap({MODEL: extreme}, SETTINGS).set_index("outcome")
    assert rows.loc["race_change_ge3", "gap"] == rows.loc["race_change_ge4", "gap"]
    assert rows.loc["race_change_ge3", "p_value"] != rows.loc["race_change_ge4", "p_value"]


def test_table_4_resamples_the_units_the_settings_name() -> None:
    frame = _wide_gap_frame()
    rows = {(resample, joint): paper_tables.race_gap(
        {MODEL: frame}, paper_tables.Resampling(n_boot=200, n_perm=50, resample=resample,
                                                simultaneous=joint),
        outcomes=["race_change_ge4"]).iloc[0]
        for resample in ("two-way", "prompts") for joint in (False, True)}
    per_row = [rows["two-way", False], rows["prompts", False]]
    assert (per_row[0]["low"], per_row[0]["high"]) != pytest.approx(
        (per_row[1]["low"], per_row[1]["high"]))
    joint = [rows["two-way", True], rows["prompts", True]]
    assert (joint[0]["low"], joint[0]["high"]) != pytest.approx(
        (joint[1]["low"], joint[1]["high"]))


def test_table_8_rows_name_their_model_sources_level_and_definition() -> None:
    def arms(races: list[str]) -> pd.DataFrame:
        return pd.concat([_small_frame({"race_change": [3, 1], "skin_tone": [4, 3]}, races,
                                       arm="none"),
                          _small_frame({"race_change": [1, 2], "skin_tone": [3, 3]}, races,
                                       arm="feature")])
    plain = _small_frame({"race_change": [3, 1]}, ["Black", "White"])
    plain["arm"] = "none"  # no feature arm: no pairs
    at_90 = paper_tables.Resampling(confidence=0.9, n_boot=50, n_perm=50)
    table = paper_tables.feature_scores({"no-pairs": plain, MODEL: arms(["Black", "White"])},
                                        at_90, axes=["gender_change", "race_change",
                                                     "skin_tone"])
    assert set(table["model"]) == {MODEL} and set(table["axis"]) == {"race_change",
                                                                     "skin_tone"}
    row = table.set_index(["axis", "race"]).loc[("race_change", "all")]
    assert (row["n_pairs"], row["n_sources"], row["confidence"]) == (2, 2, 0.9)
    assert row["definition"] == ("paper: mean ensemble race_change score with the feature "
                                 "prompt minus without, on the same pairs (1-5 score points)")


def test_the_review_check_reads_every_row_and_holds_at_zero_tolerance() -> None:
    review = _review_rows()
    means = pd.DataFrame({"model": ["a", "b", "all"], "axis": "skin_tone", "n": [2, 3, 5],
                          "judge_mean": [4.0, 3.25, 3.5], "human_mean": [3.0, 3.0, 3.0]})
    assert paper_tables.means_reproduce(review, means, tolerance=0.0)
    # A row without scores on either side does not end the check: the next row still counts.
    gap_first = review.assign(mean_difference=[0.25, 9.0, 0.5, math.nan])
    first_empty = means.assign(judge_mean=[math.nan, 3.25, 3.6])
    assert not paper_tables.means_reproduce(gap_first, first_empty)


def test_table_7_names_the_overall_rows_all_whatever_their_group() -> None:
    review = _review_rows().assign(group=["b", "Black", "every model", "a"])
    table = paper_tables.judge_human(review, None, None)
    assert list(table["model"]) == ["a", "b", paper_tables.ALL_MODELS]


def test_table_6_orders_by_model_whatever_the_files_row_labels() -> None:
    table = paper_tables.winobias(_winobias_rows([1, 0, 2]), None)
    assert list(zip(table["model"], table["role_coding"], strict=True)) == [
        ("b", "stereotype"), ("b", "male"), ("a", "female")]


def test_an_outcome_or_axis_without_data_does_not_hide_the_next() -> None:
    frame = _gap_frame()
    frame["judge_lightening"] = pd.array([None] * len(frame), dtype="boolean")
    rates = paper_tables.race_rates({MODEL: frame}, SETTINGS,
                                    outcomes=["judge_lightening", "race_change_ge4"])
    assert set(rates["outcome"]) == {"race_change_ge4"}
    none = _small_frame({"gender_change": [2, 1], "race_change": [3, 1]}, ["Black", "White"],
                        arm="none")
    feature = _small_frame({"gender_change": [None, None], "race_change": [1, 1]},
                           ["Black", "White"], arm="feature")
    scores = paper_tables.feature_scores({MODEL: pd.concat([none, feature])}, SETTINGS,
                                         axes=["gender_change", "race_change"])
    assert set(scores["axis"]) == {"race_change"}


def test_score_outcomes_follow_the_frames_own_row_labels() -> None:
    frame = pd.DataFrame({"race_change": [5.0, 1.0, None]}, index=[12, 4, 7])
    added = paper_tables.with_score_outcomes(frame)
    assert list(added.index) == [12, 4, 7]
    assert added["race_change_ge4"].tolist() == [True, False, pd.NA]
