"""Every value of the raters' and the judges' agreement tables, pinned against hand-worked small
designs and the reference libraries computed here (statsmodels' Fleiss kappa and Holm, the
``krippendorff`` package, scipy's Spearman, t and Kruskal-Wallis, scikit-posthocs' Dunn): the
columns and their order, each estimate and interval, the labels and notes, the edge cases (a
unit with one rating, one pair, everyone agreeing, "cannot tell" and unscored requests, a p
equal to alpha) and the ``alpha`` and ``confidence`` arguments.

The intervals are percentile bootstraps. With two replicates numpy's linear-interpolation
quantile of tail t lies at t of the way from the smaller replicate to the larger one, so running
the same seed (the same draws) at confidence 1 (the replicates themselves), 0.5 and 0 pins the
tail ``(1 - confidence) / 2`` without knowing which replicates were drawn; the replicates are
checked to be statistics of tables the bootstrap can draw.
"""

from __future__ import annotations

import math
import warnings

import krippendorff
import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.inter_rater import fleiss_kappa
from statsmodels.stats.multitest import multipletests

from acrb.analysis.agreement.judge_scores import ordinal_model
from acrb.analysis.agreement.judging import (
    AGREEMENT_COLUMNS as JUDGE_AGREEMENT_COLUMNS,
)
from acrb.analysis.agreement.judging import (
    MEAN_COLUMNS,
    SCORE_TEST_COLUMNS,
    _posthoc_summary,
    judge_agreement,
    judge_means,
    score_tests,
)
from acrb.analysis.agreement.raters import (
    AGREEMENT_COLUMNS,
    JUDGE_HUMAN_COLUMNS,
    _alpha,
    _fleiss,
    _item_bootstrap_weights,
    fleiss_kappa_unequal,
    intra_rater_consistency,
    judge_human_agreement,
    rater_agreement,
    replicate_alpha,
    replicate_fleiss,
    unit_counts,
)
from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError
from acrb.records import SCORE_AXES
from tests.test_agreement import item, overall, rating
from tests.test_judging import design_frame, score_table
from tests.test_survivors_agreement import quadratic_kappa

# --------------------------------------------------------------------------------------------
# The judge against people: _agreement_row through judge_human_agreement


def human_judge_units(human: list[float | None], judge: list[float | None]) -> pd.DataFrame:
    """Units of one group (edited outputs) with the people's consensus and the judge's score."""
    return pd.DataFrame({"output": "edited", "model": "m", "race": "White", "gender": "Female",
                         "age": "20s",
                         "human_edit_success": pd.array(human, dtype="Float64"),
                         "judge_edit_success": pd.array(judge, dtype="Float64")})


def pooled_row(human: list[float | None], judge: list[float | None]) -> pd.Series:
    table = judge_human_agreement(human_judge_units(human, judge), axes=("edit_success",))
    assert list(table.columns) == list(JUDGE_HUMAN_COLUMNS)
    row = table[table["dimension"] == "all"]
    assert len(row) == 1
    return row.iloc[0]


def t_interval(difference: np.ndarray) -> tuple[float, float]:
    """The 95% t interval of a mean by hand: mean -/+ t(0.975, n - 1) * sd / sqrt(n)."""
    n = len(difference)
    half = stats.t.ppf(0.975, n - 1) * difference.std(ddof=1) / math.sqrt(n)
    return difference.mean() - half, difference.mean() + half


def test_judge_against_people_every_column_on_pairs_with_gaps() -> None:
    """Four units both scored, one the people could not tell, one the judge left unscored:
    only the four pairs count (n = 4, not 5 or 6)."""
    human = [1, 2, 3, 5, None, 4]
    judge = [2, 2, 5, 5, 3, None]
    row = pooled_row(human, judge)
    h, j = np.array([1, 2, 3, 5.0]), np.array([2, 2, 5, 5.0])
    assert (row["axis"], row["dimension"], row["group"]) == ("edit_success", "all", "all")
    assert row["n"] == 4
    assert row["weighted_kappa"] == pytest.approx(float(quadratic_kappa([1, 2, 3, 5],
                                                                        [2, 2, 5, 5])))
    # judge - human = 1, 0, 2, 0: a mean of 3/4 (positive: the judge reads higher).
    assert row["mean_difference"] == pytest.approx(0.75)
    low, high = t_interval(j - h)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    rho = stats.spearmanr(h, j)
    assert row["spearman"] == pytest.approx(rho.statistic)
    assert row["spearman_p"] == pytest.approx(rho.pvalue)
    assert row["note"] == ""


def test_judge_against_people_three_units_have_a_spearman() -> None:
    row = pooled_row([1, 2, 4], [1, 3, 3])
    rho = stats.spearmanr([1, 2, 4], [1, 3, 3])
    assert row["n"] == 3
    assert row["spearman"] == pytest.approx(rho.statistic)
    assert row["spearman_p"] == pytest.approx(rho.pvalue)
    assert row["note"] == ""


def test_judge_against_people_two_units_have_an_interval_and_no_spearman() -> None:
    # Differences 0 and 2: mean 1, sd sqrt(2), t interval with one degree of freedom.
    row = pooled_row([1, 3], [1, 5])
    low, high = t_interval(np.array([0.0, 2.0]))
    assert row["n"] == 2 and row["mean_difference"] == pytest.approx(1.0)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert math.isnan(row["spearman"]) and math.isnan(row["spearman_p"])
    assert row["note"] == "Spearman undefined: fewer than 3 units or a constant score"


def test_judge_against_people_equal_differences_give_a_point_interval() -> None:
    """Every difference is 1: the standard error is 0, the interval is the mean itself."""
    row = pooled_row([1, 2, 3, 4], [2, 3, 4, 5])
    assert row["mean_difference"] == 1.0
    assert (row["ci_low"], row["ci_high"]) == (1.0, 1.0)
    assert row["spearman"] == pytest.approx(1.0)


def test_judge_against_people_one_unit() -> None:
    """One pair, 3 against 4: quadratic kappa 1 - (1/1) / (1/1) = 0 (by hand), no interval."""
    row = pooled_row([3], [4])
    assert row["n"] == 1
    assert row["weighted_kappa"] == pytest.approx(float(quadratic_kappa([3], [4]))) == 0.0
    assert row["mean_difference"] == 1.0
    assert math.isnan(row["ci_low"]) and math.isnan(row["ci_high"])
    assert row["note"] == "Spearman undefined: fewer than 3 units or a constant score"


@pytest.mark.parametrize("constant", ["human", "judge"])
def test_judge_against_people_constant_scores_have_no_spearman(constant: str) -> None:
    varying = [1, 2, 4, 5]
    human, judge = ([3] * 4, varying) if constant == "human" else (varying, [3] * 4)
    row = pooled_row(human, judge)
    assert row["n"] == 4 and math.isnan(row["spearman"]) and math.isnan(row["spearman_p"])
    assert row["note"] == "Spearman undefined: fewer than 3 units or a constant score"
    assert row["mean_difference"] == pytest.approx(np.mean(np.subtract(judge, human)))


def test_judge_against_people_a_one_step_range_is_not_constant() -> None:
    """Scores spanning one step (2 and 3) vary: Spearman is defined."""
    for human, judge in (([2, 3, 3, 2], [1, 4, 5, 2]), ([1, 4, 5, 2], [2, 3, 3, 2])):
        row = pooled_row(human, judge)
        rho = stats.spearmanr(human, judge)
        assert row["spearman"] == pytest.approx(rho.statistic)
        assert row["note"] == ""


def test_judge_against_people_no_unit_scored_by_both() -> None:
    row = pooled_row([1, None], [None, 2])
    assert row["n"] == 0
    for column in ("weighted_kappa", "spearman", "spearman_p", "mean_difference", "ci_low",
                   "ci_high"):
        assert math.isnan(row[column]), column
    assert row["note"] == "no unit scored by both"


# --------------------------------------------------------------------------------------------
# The weighted kappa (_weighted_kappa through intra_rater_consistency)


def test_weighted_kappa_weighs_by_the_scale_values_not_the_levels_used() -> None:
    """Only 1, 2 and 5 are used: quadratic weights on the 1-5 scale put (2 - 5)^2 = 9 on that
    disagreement and 1 on (1 - 2)^2; weights over the three levels used would put 1 on both
    (evenly spaced levels such as 1, 3, 5 would hide the difference: it rescales all weights
    alike)."""
    first, again = [1, 2, 5, 1, 5, 2], [1, 5, 5, 2, 5, 2]
    rows = [rating("a", f"i{i}", edit_success=v) for i, v in enumerate(first)]
    rows += [rating("a", f"i{i}", repeat=True, edit_success=v) for i, v in enumerate(again)]
    table = intra_rater_consistency(pd.DataFrame(rows), axes=("edit_success", "skin_tone"))
    row = table[(table["axis"] == "edit_success") & (table["rater"] == "all")].iloc[0]
    assert row["weighted_kappa"] == pytest.approx(float(quadratic_kappa(first, again)))
    # Nobody answered skin tone: no pair, a NaN kappa (not an error), and the note.
    empty = table[(table["axis"] == "skin_tone") & (table["rater"] == "all")].iloc[0]
    assert empty["n_pairs"] == 0 and math.isnan(empty["weighted_kappa"])
    assert empty["note"] == "no pair answered on this axis"


def test_weighted_kappa_of_one_disagreeing_pair_is_zero() -> None:
    rows = [rating("a", "i0", edit_success=2), rating("a", "i0", repeat=True, edit_success=4)]
    table = intra_rater_consistency(pd.DataFrame(rows), axes=("edit_success",))
    row = table[table["rater"] == "all"].iloc[0]
    assert row["weighted_kappa"] == 0.0 == float(quadratic_kappa([2], [4]))


# --------------------------------------------------------------------------------------------
# The count table, Fleiss' kappa and Krippendorff's alpha


def test_unit_counts_table_and_labels() -> None:
    ratings = pd.DataFrame([
        rating("a", "i0", edit_success=1), rating("b", "i0", edit_success=5),
        rating("c", "i0", edit_success=5),
        rating("a", "i1", "feature", edit_success=3), rating("b", "i1", "feature",
                                                             edit_success=3),
        rating("a", "i2", edit_success=2),  # one answer: no pair, dropped
        rating("b", "i2", edit_success=None),  # cannot tell
    ])
    items = pd.DataFrame([item("i0", race="Black", model="m1"),
                          item("i1", race="Indian", gender="Male", age="70plus", model="m2"),
                          item("i2")])
    table = unit_counts(ratings, items, "edit_success")
    assert table.counts.tolist() == [[1, 0, 0, 0, 2], [0, 0, 2, 0, 0]]
    assert table.n_ratings.tolist() == [3, 2]
    units = table.units
    assert list(units.columns) == ["item_id", "output", "model", "race", "gender", "age"]
    assert units.values.tolist() == [["i0", "edited", "m1", "Black", "Female", "20s"],
                                     ["i1", "feature", "m2", "Indian", "Male", "70plus"]]


def test_unit_counts_of_an_axis_nobody_answered() -> None:
    ratings = pd.DataFrame([rating("a", "i0"), rating("b", "i0")])
    table = unit_counts(ratings, pd.DataFrame([item("i0")]), "edit_success")
    assert table.counts.shape == (0, 5) and table.counts.dtype == np.int64
    assert list(table.units.columns) == ["item_id", "output", "model", "race", "gender", "age"]


def test_fleiss_kappa_unequal_edge_cases() -> None:
    assert math.isnan(fleiss_kappa_unequal(np.array([])))
    assert math.isnan(fleiss_kappa_unequal(np.zeros((0, 5))))
    # Only units with one rating: none is left.
    assert math.isnan(fleiss_kappa_unequal(np.array([[1, 0], [0, 1]])))
    # Every rating in one category: chance agreement 1, kappa 0/0.
    assert math.isnan(fleiss_kappa_unequal(np.array([[2, 0], [3, 0]])))
    # Two units of two ratings each, (2, 0) and (1, 1): p_a = (1 + 0) / 2 = 1/2, shares
    # (3/4, 1/4), p_e = 10/16, kappa = (1/2 - 5/8) / (3/8) = -1/3; statsmodels agrees.
    counts = np.array([[2, 0], [1, 1]])
    assert fleiss_kappa_unequal(counts) == pytest.approx(-1 / 3)
    assert fleiss_kappa(counts, method="fleiss") == pytest.approx(-1 / 3)


def test_fleiss_statistic_edge_cases() -> None:
    assert math.isnan(_fleiss(np.zeros((0, 5), dtype=np.int64)))
    # Equal counts, one category used: statsmodels would divide by zero; NaN.
    assert math.isnan(_fleiss(np.array([[3, 0, 0, 0, 0], [3, 0, 0, 0, 0]])))
    # One unit: statsmodels' kappa of a single unit.
    one = np.array([[1, 1, 0, 0, 0]])
    assert _fleiss(one) == pytest.approx(fleiss_kappa(one, method="fleiss"))
    # Unequal counts: the generalised kappa, worked by hand above (-1/3 with equal counts;
    # here (3, 0), (1, 1): p_a = (1 + 0) / 2, shares (3/4, 1/4), the same -1/3).
    assert _fleiss(np.array([[3, 0, 0, 0, 0], [1, 1, 0, 0, 0]])) == pytest.approx(-1 / 3)


def test_alpha_needs_two_values_used() -> None:
    assert math.isnan(_alpha(np.zeros((0, 5)), "ordinal"))
    assert math.isnan(_alpha(np.array([[2, 0, 0, 0, 0], [3, 0, 0, 0, 0]]), "interval"))
    counts = np.array([[1, 1, 0, 0, 0], [2, 0, 0, 0, 0]])  # values 1 and 2 only
    data = [[1, 1], [2, 1]]  # raters x units
    for level in ("ordinal", "interval"):
        assert _alpha(counts, level) == pytest.approx(
            krippendorff.alpha(reliability_data=data, level_of_measurement=level))
    # Ordinal and interval differ once three values are used (ranks against distances).
    spread = np.array([[1, 0, 1, 0, 0], [0, 0, 0, 1, 1], [0, 2, 0, 0, 0]])
    data = [[1, 4, 2], [3, 5, 2]]
    for level in ("ordinal", "interval"):
        assert _alpha(spread, level) == pytest.approx(
            krippendorff.alpha(reliability_data=data, level_of_measurement=level,
                               value_domain=[1, 2, 3, 4, 5]))
    assert _alpha(spread, "ordinal") != pytest.approx(_alpha(spread, "interval"))


def test_item_bootstrap_weights_draw_items_with_both_outputs() -> None:
    """Units 0 and 1 are the two outputs of item 0: they always share a weight; each replicate
    draws as many items as there are (3), each item about once on average."""
    codes = np.array([0, 0, 1, 2])
    weights = _item_bootstrap_weights(codes, 4000, np.random.default_rng(0))
    assert weights.shape == (4000, 4)
    assert (weights[:, 0] == weights[:, 1]).all()
    assert (weights[:, [0, 2, 3]].sum(axis=1) == 3).all()
    assert weights[:, [0, 2, 3]].mean(axis=0) == pytest.approx([1, 1, 1], abs=0.05)
    # Multinomial(3, 1/3): an item is left out of a replicate with probability (2/3)^3.
    assert (weights[:, 3] == 0).mean() == pytest.approx(8 / 27, abs=0.03)


def test_replicates_of_an_empty_or_one_valued_replicate_are_nan() -> None:
    counts = np.array([[2, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    weights = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 5]])
    kappa = replicate_fleiss(counts, weights)
    assert math.isnan(kappa[0]) and math.isnan(kappa[1])  # no unit; one category only
    # One unit (1, 1): p_a = 0, shares (1/2, 1/2), p_e = 1/2: kappa -1 (statsmodels too).
    assert kappa[2] == pytest.approx(-1.0) == pytest.approx(
        fleiss_kappa(np.array([[1, 1]]), method="fleiss"))
    # The unit with one rating carries no pair, however often it is drawn: -1/3 as above.
    assert kappa[3] == pytest.approx(-1 / 3)
    alpha = replicate_alpha(counts, weights, "interval")
    assert math.isnan(alpha[0]) and math.isnan(alpha[1])
    assert alpha[3] == pytest.approx(_alpha(counts[[0, 1, 2, 2, 2, 2, 2]], "interval"))


def test_undefined_coefficients_are_nan_without_a_numpy_warning() -> None:
    """Every rating in one category (or one value used, or an empty replicate) has no chance
    disagreement: the coefficient is 0/0. Each function says NaN itself rather than let
    statsmodels, the krippendorff package or numpy divide by zero and warn."""
    one_value = np.array([[3, 0, 0, 0, 0], [3, 0, 0, 0, 0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(_fleiss(one_value))
        assert math.isnan(fleiss_kappa_unequal(np.array([[3, 0], [2, 0]])))
        assert math.isnan(_alpha(one_value, "interval"))
        assert math.isnan(_alpha(one_value, "ordinal"))
        weights = np.array([[0, 0], [1, 2]])
        assert np.isnan(replicate_fleiss(one_value, weights)).all()
        for level in ("interval", "ordinal"):
            assert np.isnan(replicate_alpha(one_value, weights, level)).all()


def test_alpha_of_one_unit() -> None:
    """One unit rated 1 and 2: observed and expected disagreement are the same pair, alpha 0
    (the krippendorff package agrees)."""
    one = np.array([[1, 1, 0, 0, 0]])
    for level in ("interval", "ordinal"):
        assert _alpha(one, level) == 0.0 == krippendorff.alpha(
            reliability_data=[[1], [2]], level_of_measurement=level)


# --------------------------------------------------------------------------------------------
# rater_agreement and _arm_agreement


def two_item_ratings() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Item a rated 1, 1, 2 and item b 3, 5, 5 (edited outputs), of two races and models."""
    ratings = [rating(r, "a", edit_success=v) for r, v in zip("xyz", (1, 1, 2), strict=True)]
    ratings += [rating(r, "b", edit_success=v) for r, v in zip("xyz", (3, 5, 5), strict=True)]
    items = [item("a", race="Black", model="m1"), item("b", race="White", model="m2")]
    return pd.DataFrame(ratings), pd.DataFrame(items)


TWO_ITEMS = {"a": [2, 1, 0, 0, 0], "b": [0, 0, 1, 0, 2]}


def drawable_statistics(statistic: str) -> set[float]:
    """The statistic of each table a bootstrap over the two items can draw: a twice, a and b,
    b twice (copies of a unit), by the reference libraries."""
    tables = [np.array([TWO_ITEMS[x] for x in draw]) for draw in ("aa", "ab", "bb")]
    values = []
    for table in tables:
        if statistic == "fleiss_kappa":
            values.append(fleiss_kappa(table, method="fleiss"))
        else:
            data = [[v + 1 for v, c in enumerate(unit) for _ in range(c)] for unit in table]
            values.append(krippendorff.alpha(reliability_data=np.array(data, float).T,
                                             level_of_measurement=statistic.split("_")[1],
                                             value_domain=[1, 2, 3, 4, 5]))
    return {round(float(v), 12) for v in values if np.isfinite(v)}


def test_every_column_of_the_rows_of_two_items() -> None:
    ratings, items = two_item_ratings()
    table = rater_agreement(ratings, items, axes=("edit_success",), n_boot=0)
    assert list(table.columns) == list(AGREEMENT_COLUMNS)
    # Only edited outputs: the arms are edited and both (no feature rating to report).
    assert list(dict.fromkeys(table["arm"])) == ["edited", "both"]
    edited = table[table["arm"] == "edited"]
    cells = [("all", "all"), ("model", "m1"), ("model", "m2"), ("race", "Black"),
             ("race", "White"), ("gender", "Female"), ("age", "20s")]
    expected_order = [(s, d, g) for d, g in cells
                      for s in ("fleiss_kappa", "alpha_ordinal", "alpha_interval")]
    assert list(zip(edited["statistic"], edited["dimension"], edited["group"],
                    strict=True)) == expected_order
    assert (edited["axis"] == "edit_success").all()
    pooled = edited[edited["dimension"] == "all"].set_index("statistic")
    counts = np.array([TWO_ITEMS["a"], TWO_ITEMS["b"]])
    assert pooled.loc["fleiss_kappa", "estimate"] == pytest.approx(
        fleiss_kappa(counts, method="fleiss"))
    for level in ("ordinal", "interval"):
        assert pooled.loc[f"alpha_{level}", "estimate"] == pytest.approx(krippendorff.alpha(
            reliability_data=[[1, 3], [1, 5], [2, 5]], level_of_measurement=level,
            value_domain=[1, 2, 3, 4, 5]))
    assert pooled["n_items"].tolist() == [2, 2, 2]
    assert pooled["n_units"].tolist() == [2, 2, 2]
    assert pooled["n_ratings"].tolist() == [6, 6, 6]
    assert pooled["note"].tolist() == ["", "", ""]
    assert pooled["ci_low"].isna().all() and pooled["ci_high"].isna().all()  # n_boot = 0
    assert table["ci_low"].dtype == table["ci_high"].dtype == np.float64
    # A one-item cell: item a alone (race Black), 1, 1, 2.
    black = edited[edited["group"] == "Black"].set_index("statistic")
    assert black.loc["fleiss_kappa", "estimate"] == pytest.approx(
        fleiss_kappa(np.array([TWO_ITEMS["a"]]), method="fleiss"))
    assert black["n_items"].tolist() == [1, 1, 1]
    assert black["n_ratings"].tolist() == [3, 3, 3]
    assert black["note"].tolist() == ["one item: no interval"] * 3
    pd.testing.assert_frame_equal(
        table[table["arm"] == "both"].drop(columns="arm").reset_index(drop=True),
        edited.drop(columns="arm").reset_index(drop=True))


def test_the_default_arms_follow_the_outputs_rated() -> None:
    ratings, items = two_item_ratings()
    feature = ratings.assign(output="feature")
    table = rater_agreement(feature, items, axes=("edit_success",), n_boot=0)
    assert list(dict.fromkeys(table["arm"])) == ["feature", "both"]
    table = rater_agreement(pd.concat([ratings, feature]), items, axes=("edit_success",),
                            n_boot=0)
    assert list(dict.fromkeys(table["arm"])) == ["edited", "feature", "both"]
    # Chosen arms are reported in the order asked, with the statistics of the levels asked.
    table = rater_agreement(ratings, items, axes=("edit_success", "skin_tone"),
                            arms=("both", "edited"), levels=("nominal",), n_boot=0)
    pooled = table[table["dimension"] == "all"]
    assert list(zip(pooled["axis"], pooled["arm"], pooled["statistic"], strict=True)) == [
        ("edit_success", "both", "fleiss_kappa"), ("edit_success", "both", "alpha_nominal"),
        ("edit_success", "edited", "fleiss_kappa"), ("edit_success", "edited", "alpha_nominal"),
        ("skin_tone", "both", "fleiss_kappa"), ("skin_tone", "both", "alpha_nominal"),
        ("skin_tone", "edited", "fleiss_kappa"), ("skin_tone", "edited", "alpha_nominal")]


def test_an_unknown_arm_is_named_with_the_valid_ones() -> None:
    ratings, items = two_item_ratings()
    with pytest.raises(InputDataError) as raised:
        rater_agreement(ratings, items, axes=("edit_success",), arms=("edited", "left"),
                        n_boot=0)
    assert raised.value.problem == "unknown review arm 'left'"
    assert raised.value.fix == "use any of ['edited', 'feature', 'both']"


def test_an_axis_with_no_pair_gives_one_row_per_statistic() -> None:
    ratings, items = two_item_ratings()
    table = rater_agreement(ratings, items, axes=("skin_tone",), arms=("edited",), n_boot=50)
    assert table["statistic"].tolist() == ["fleiss_kappa", "alpha_ordinal", "alpha_interval"]
    assert (table["dimension"] == "all").all() and (table["group"] == "all").all()
    assert table[["n_items", "n_units", "n_ratings"]].values.tolist() == [[0, 0, 0]] * 3
    assert table[["estimate", "ci_low", "ci_high"]].isna().all().all()
    assert table["note"].tolist() == ["no unit with two ratings"] * 3


def test_everyone_agreeing_on_one_value_is_undefined() -> None:
    ratings = pd.DataFrame([rating(r, i, edit_success=4) for r in "xy" for i in "ab"])
    items = pd.DataFrame([item("a"), item("b")])
    table = rater_agreement(ratings, items, axes=("edit_success",), arms=("edited",),
                            n_boot=50)
    pooled = table[table["dimension"] == "all"]
    assert pooled[["estimate", "ci_low", "ci_high"]].isna().all().all()
    assert pooled["note"].tolist() == ["undefined: fewer than two values used"] * 3
    assert pooled["n_ratings"].tolist() == [4, 4, 4]


def test_unequal_counts_are_named_in_the_kappa_note_only() -> None:
    ratings, items = two_item_ratings()
    ratings = pd.concat([ratings, pd.DataFrame([rating("w", "b", edit_success=4)])])
    table = rater_agreement(ratings, items, axes=("edit_success",), arms=("edited",),
                            n_boot=0)
    pooled = overall(table, "edit_success", "fleiss_kappa", "edited")
    assert pooled["note"] == ("3-4 ratings per unit: Fleiss' kappa generalised to unequal "
                              "counts, every unit weighted equally")
    # (2, 1, 0, 0, 0) and (0, 0, 1, 1, 2): the generalised kappa.
    assert pooled["estimate"] == pytest.approx(
        fleiss_kappa_unequal(np.array([[2, 1, 0, 0, 0], [0, 0, 1, 1, 2]])))
    assert overall(table, "edit_success", "alpha_interval", "edited")["note"] == ""


def bootstrap_rows(confidence: float, n_boot: int = 2, seed: int = 0) -> pd.DataFrame:
    ratings, items = two_item_ratings()
    table = rater_agreement(ratings, items, axes=("edit_success",), arms=("edited",),
                            n_boot=n_boot, seed=seed, confidence=confidence)
    return table[table["dimension"] == "all"].set_index("statistic")


@pytest.mark.parametrize("statistic", ["fleiss_kappa", "alpha_ordinal", "alpha_interval"])
def test_the_interval_is_the_percentile_of_the_confidence(statistic: str) -> None:
    # Seed 1 draws two different replicates for every statistic (checked below).
    replicates = bootstrap_rows(1.0, seed=1).loc[statistic]
    smaller, larger = replicates["ci_low"], replicates["ci_high"]
    drawable = drawable_statistics(statistic)
    assert round(smaller, 12) in drawable and round(larger, 12) in drawable
    assert smaller < larger
    half = bootstrap_rows(0.5, seed=1).loc[statistic]
    assert half["ci_low"] == pytest.approx(smaller + 0.25 * (larger - smaller))
    assert half["ci_high"] == pytest.approx(larger - 0.25 * (larger - smaller))
    none = bootstrap_rows(0.0, seed=1).loc[statistic]
    assert none["ci_low"] == pytest.approx((smaller + larger) / 2)
    assert none["ci_high"] == pytest.approx((smaller + larger) / 2)
    # With many replicates every drawable table is drawn: the 95% interval spans them all.
    wide = bootstrap_rows(0.95, n_boot=400).loc[statistic]
    assert (wide["ci_low"], wide["ci_high"]) == (pytest.approx(min(drawable)),
                                                 pytest.approx(max(drawable)))
    assert wide["note"] == ""


def test_a_cell_of_two_items_gets_an_interval_and_none_without_replicates() -> None:
    ratings, items = two_item_ratings()
    table = rater_agreement(ratings, items, axes=("edit_success",), arms=("edited",),
                            n_boot=50, seed=2)
    pooled = table[table["dimension"] == "all"]
    assert pooled["ci_low"].notna().all() and pooled["ci_high"].notna().all()
    one_item = table[table["group"] == "Black"]
    assert one_item["ci_low"].isna().all() and one_item["ci_high"].isna().all()


# --------------------------------------------------------------------------------------------
# The judges' mean scores (judge_means)


def two_source_frame() -> pd.DataFrame:
    """Source s1 scored 1 and 3, source s2 scored 5 (its second request unscored), and
    requests that do not count: an errored one with a score, a missing one.

    Mean 9 / 3 = 3. A bootstrap over the two sources can draw s1 twice (4 + 4) / (2 + 2) = 2,
    both (4 + 5) / 3 = 3, or s2 twice 10 / 2 = 5."""
    rows = [("r1", "s1", "ok", 1.0), ("r2", "s1", "refused", 3.0), ("r3", "s2", "ok", 5.0),
            ("r4", "s2", "ok", None), ("r5", "s2", "error", 1.0), ("r6", "s3", "missing", 2.0)]
    frame = pd.DataFrame(rows, columns=["request_id", "source_id", "status", "edit_success"])
    return frame.assign(cue_retention=[0.5, 0.5, 1.0, None, None, None])


def test_judge_means_every_column() -> None:
    table = judge_means(two_source_frame(), n_boot=400, seed=0)
    assert list(table.columns) == list(MEAN_COLUMNS)
    assert table["axis"].tolist() == list(SCORE_AXES)
    assert (table["method"] == "percentile cluster bootstrap over sources").all()
    edit = table.set_index("axis").loc["edit_success"]
    assert (edit["n"], edit["n_sources"], edit["mean"]) == (3, 2, 3.0)
    # Every drawable replicate is drawn: the 95% interval runs from 2 to 5.
    assert (edit["ci_low"], edit["ci_high"]) == (pytest.approx(2.0), pytest.approx(5.0))
    # Cue retention: s1 (0.5, 0.5) and s2 (1.0): mean 2 / 3; replicates 0.5, 2/3 and 1.
    cue = table.set_index("axis").loc["cue_retention"]
    assert (cue["n"], cue["n_sources"]) == (3, 2)
    assert cue["mean"] == pytest.approx(2 / 3)
    assert (cue["ci_low"], cue["ci_high"]) == (pytest.approx(0.5), pytest.approx(1.0))
    # The axes the frame lacks: nothing scored.
    for axis in ("skin_tone", "aging_accuracy"):
        row = table.set_index("axis").loc[axis]
        assert (row["n"], row["n_sources"]) == (0, 0)
        assert math.isnan(row["mean"]) and math.isnan(row["ci_low"])
        assert math.isnan(row["ci_high"])


def test_judge_means_interval_is_the_percentile_of_the_confidence() -> None:
    frame = two_source_frame()

    def bounds(confidence: float) -> tuple[float, float]:
        row = judge_means(frame, confidence=confidence, n_boot=2, seed=4).iloc[0]
        assert row["axis"] == "edit_success"
        return row["ci_low"], row["ci_high"]

    smaller, larger = bounds(1.0)  # the two replicates themselves (seed 4 draws two kinds)
    assert {smaller, larger} <= {2.0, 3.0, 5.0} and smaller < larger
    spread = larger - smaller
    assert bounds(0.5) == (pytest.approx(smaller + 0.25 * spread),
                           pytest.approx(larger - 0.25 * spread))
    assert bounds(0.0) == (pytest.approx(smaller + 0.5 * spread),) * 2


def test_judge_means_one_source_has_no_interval_and_the_draws_are_seeded() -> None:
    one = two_source_frame().query("source_id == 's1'")
    row = judge_means(one, n_boot=50).iloc[0]
    assert (row["n"], row["n_sources"], row["mean"]) == (2, 1, 2.0)
    assert math.isnan(row["ci_low"]) and math.isnan(row["ci_high"])
    frame = design_frame().assign(edit_success=np.random.default_rng(3).integers(1, 6, 84))
    a = judge_means(frame, n_boot=200, seed=7)
    pd.testing.assert_frame_equal(a, judge_means(frame, n_boot=200, seed=7))
    assert a["ci_low"].iloc[0] != judge_means(frame, n_boot=200, seed=8)["ci_low"].iloc[0]


def test_judge_means_names_a_missing_column() -> None:
    frame = two_source_frame()
    for column in ("status", "source_id"):
        with pytest.raises(InputDataError, match=f"lacks column.*{column}"):
            judge_means(frame.drop(columns=column), n_boot=10)


# --------------------------------------------------------------------------------------------
# The judges' agreement (judge_agreement, _agreement)


def test_judge_agreement_rows_for_every_pair_axis_and_group() -> None:
    frame = design_frame()[:4]  # Black Female 20s / 70plus, three prompts and one more
    first = score_table(frame, "g", edit_success=[1, 2, 5, 1], cue_retention=[0, .5, 1, 1])
    second = score_table(frame, "o", edit_success=[1, 5, 5, 2], cue_retention=[0, 1, 1, .5])
    third = score_table(frame, "p", ["scored", "scored", "abstained", "scored"],
                        edit_success=[1, 2, 5, 1])
    # A duplicated request in the frame and a request outside it change nothing.
    extra = score_table(design_frame()[80:81], "g", edit_success=[2])
    frame2 = pd.concat([frame, frame.iloc[[0]]])
    table = judge_agreement({"g": pd.concat([first, extra]), "o": second, "p": third},
                            frame2)
    assert list(table.columns) == list(JUDGE_AGREEMENT_COLUMNS)
    cells = [("all", "all")] + [(d, g) for d, vocabulary in SOURCE_DIMENSIONS.items()
                                for g in vocabulary]
    per_pair = [(a, d, g) for a in SCORE_AXES for d, g in cells]
    assert list(zip(table["judges"], table["axis"], table["dimension"], table["group"],
                    strict=True)) == [(j, *key) for j in ("g vs o", "g vs p", "o vs p")
                                      for key in per_pair]
    assert set(table.loc[table["axis"] == "cue_retention", "level"]) == {"interval"}
    assert set(table.loc[table["axis"] != "cue_retention", "level"]) == {"ordinal"}
    rows = table.set_index(["judges", "axis", "dimension", "group"])
    go = rows.loc[("g vs o", "edit_success", "all", "all")]
    assert go["n_pairs"] == 4
    # Scores 1, 2, 5 only: quadratic weights on the 1-5 scale (by hand), not over the
    # three levels used.
    assert go["kappa"] == pytest.approx(float(quadratic_kappa([1, 2, 5, 1], [1, 5, 5, 2])))
    assert go["alpha"] == pytest.approx(krippendorff.alpha(
        reliability_data=[[1, 2, 5, 1], [1, 5, 5, 2]], level_of_measurement="ordinal",
        value_domain=[1, 2, 3, 4, 5]))
    assert go["note"] == ""
    assert rows.loc[("g vs o", "edit_success", "race", "Black"), "kappa"] == go["kappa"]
    white = rows.loc[("g vs o", "edit_success", "race", "White")]
    assert white["n_pairs"] == 0 and white["note"] == "fewer than two pairs"
    cue = rows.loc[("g vs o", "cue_retention", "all", "all")]
    assert math.isnan(cue["kappa"])
    assert cue["alpha"] == pytest.approx(krippendorff.alpha(
        reliability_data=[[0, .5, 1, 1], [0, 1, 1, .5]], level_of_measurement="interval"))
    assert cue["note"] == "kappa not defined for a fraction axis (see alpha, interval)"
    # Judge p abstained on one request: three pairs, and they agree exactly with g.
    gp = rows.loc[("g vs p", "edit_success", "all", "all")]
    assert gp["n_pairs"] == 3 and gp["kappa"] == pytest.approx(1.0)
    assert gp["alpha"] == pytest.approx(1.0)
    # p scored no cue retention: no pair.
    assert rows.loc[("o vs p", "cue_retention", "all", "all"), "n_pairs"] == 0


def test_judge_agreement_two_pairs_are_enough_one_is_not() -> None:
    frame = design_frame()[:2]
    two = judge_agreement({"g": score_table(frame, "g", edit_success=[1, 2]),
                           "o": score_table(frame, "o", edit_success=[1, 3])}, frame)
    row = two[(two["axis"] == "edit_success") & (two["dimension"] == "all")].iloc[0]
    assert row["n_pairs"] == 2
    assert row["kappa"] == pytest.approx(float(quadratic_kappa([1, 2], [1, 3])))
    assert row["note"] == ""
    one = judge_agreement({"g": score_table(frame[:1], "g", edit_success=[1]),
                           "o": score_table(frame[:1], "o", edit_success=[2])}, frame)
    row = one[(one["axis"] == "edit_success") & (one["dimension"] == "all")].iloc[0]
    assert row["n_pairs"] == 1 and math.isnan(row["kappa"]) and math.isnan(row["alpha"])
    assert row["note"] == "fewer than two pairs"
    same = judge_agreement({"g": score_table(frame, "g", cue_retention=[0.5, 0.5]),
                            "o": score_table(frame, "o", cue_retention=[0.5, 0.5])}, frame)
    row = same[(same["axis"] == "cue_retention") & (same["dimension"] == "all")].iloc[0]
    assert math.isnan(row["kappa"]) and math.isnan(row["alpha"])
    assert row["note"] == "one category only: agreement undefined"
    assert judge_agreement({"g": score_table(frame, "g")}, frame).empty


def test_judge_agreement_names_a_missing_column() -> None:
    frame = design_frame()[:2]
    scores = {"g": score_table(frame, "g"), "o": score_table(frame, "o")}
    for column in ("request_id", "race", "gender", "age"):
        with pytest.raises(InputDataError, match=f"lacks column.*{column}"):
            judge_agreement(scores, frame.drop(columns=column))


# --------------------------------------------------------------------------------------------
# The score tests (score_tests, _posthoc_summary)


def test_posthoc_summary_reads_the_upper_triangle_below_alpha() -> None:
    names = ["Black", "Indian", "White"]
    # Upper triangle: the pairs; the lower one is set apart to show it is not read.
    posthoc = pd.DataFrame([[1.0, 0.012345, 0.2], [0.9, 1.0, 0.049], [0.9, 0.9, 1.0]],
                           index=names, columns=names)
    assert _posthoc_summary(posthoc, 0.05) == ("Black vs Indian (p=0.0123); "
                                               "Indian vs White (p=0.049)")
    assert _posthoc_summary(posthoc, 0.049) == "Black vs Indian (p=0.0123)"  # strictly below
    assert _posthoc_summary(posthoc, 0.3) == ("Black vs Indian (p=0.0123); Black vs White "
                                              "(p=0.2); Indian vs White (p=0.049)")
    posthoc.loc["Black", "Indian"] = np.nan
    assert _posthoc_summary(posthoc, 0.05) == "Indian vs White (p=0.049)"
    assert _posthoc_summary(pd.DataFrame(), 0.05) == ""


def race_effect_frame() -> pd.DataFrame:
    """Edit success about 1.5 on Black faces, 4.5 on White ones, 3 elsewhere; one usable request
    unscored (missing), one errored (not counted)."""
    frame = design_frame()
    rng = np.random.default_rng(0)
    centre = frame["race"].map({"Black": 1.5, "White": 4.5}).fillna(3.0).to_numpy()
    frame["edit_success"] = np.clip(np.round(centre + rng.normal(0, 0.7, len(frame))), 1, 5)
    frame["cue_retention"] = rng.uniform(0, 1, len(frame)).round(2)
    frame.loc[0, "edit_success"] = np.nan
    frame.loc[1, "status"] = "error"
    return frame


def source_means(frame: pd.DataFrame, axis: str, dimension: str) -> list[np.ndarray]:
    usable = frame[frame["status"].isin(["ok", "refused"]) & frame[axis].notna()]
    means = usable.groupby(["source_id", dimension])[axis].mean().reset_index()
    return [means.loc[means[dimension] == g, axis].to_numpy()
            for g in SOURCE_DIMENSIONS[dimension] if (means[dimension] == g).any()]


def dunn_summary(frame: pd.DataFrame, axis: str, dimension: str, alpha: float) -> str:
    """Dunn's pairs below alpha by scikit-posthocs itself (Holm over the pairs), in
    vocabulary order."""
    import scikit_posthocs

    usable = frame[frame["status"].isin(["ok", "refused"]) & frame[axis].notna()]
    means = usable.groupby(["source_id", dimension])[axis].mean().reset_index()
    p = scikit_posthocs.posthoc_dunn(means, val_col=axis, group_col=dimension,
                                     p_adjust="holm")
    names = [g for g in SOURCE_DIMENSIONS[dimension] if g in p.index]
    return "; ".join(f"{a} vs {b} (p={p.loc[a, b]:.3g})" for i, a in enumerate(names)
                     for b in names[i + 1:] if p.loc[a, b] < alpha)


def test_score_tests_every_column_against_scipy_and_holm() -> None:
    frame = race_effect_frame()
    table = score_tests(frame, 0.05, axes=("edit_success", "cue_retention"), ordinal=False)
    assert list(table.columns) == list(SCORE_TEST_COLUMNS)
    keys = [(a, d) for a in ("edit_success", "cue_retention") for d in SOURCE_DIMENSIONS]
    assert list(zip(table["axis"], table["dimension"], strict=True)) == keys
    assert (table["test"] == "Kruskal-Wallis + Dunn").all()
    for row in table.itertuples():
        samples = source_means(frame, row.axis, row.dimension)
        expected = stats.kruskal(*samples)
        assert row.statistic == pytest.approx(expected.statistic), row
        assert row.p_value == pytest.approx(expected.pvalue), row
        assert row.df == len(samples) - 1
        assert row.n == 28  # sources
        assert row.n_missing == (1 if row.axis == "edit_success" else 0)
        assert row.posthoc == dunn_summary(frame, row.axis, row.dimension, 0.05)
        assert row.note == ""
    assert table["p_adjusted"].to_numpy() == pytest.approx(
        multipletests(table["p_value"], method="holm")[1])
    assert table["significant"].dtype == "boolean"
    assert table["significant"].tolist() == (table["p_adjusted"] < 0.05).tolist()
    race = table.iloc[0]
    assert race["significant"] and race["posthoc"].startswith("Black vs")


def test_score_tests_alpha_sets_significance_and_the_pairs_shown() -> None:
    frame = race_effect_frame()
    base = score_tests(frame, 0.05, axes=("edit_success",), ordinal=False)
    race_p = float(base["p_adjusted"].iloc[0])
    # Just above and just below the race test's adjusted p.
    for alpha, expected in ((race_p * 1.01, True), (race_p * 0.99, False)):
        table = score_tests(frame, alpha, axes=("edit_success",), ordinal=False)
        assert bool(table["significant"].iloc[0]) is expected
        assert table["significant"].tolist() == (table["p_adjusted"] < alpha).tolist()
    loose = score_tests(frame, 0.5, axes=("edit_success",), ordinal=False)
    assert loose["posthoc"].iloc[0] == dunn_summary(frame, "edit_success", "race", 0.5)
    assert len(loose["posthoc"].iloc[0]) > len(base["posthoc"].iloc[0])


def test_score_tests_ordinal_rows_and_untestable_cells() -> None:
    frame = race_effect_frame()
    frame["gender"] = "Female"  # one gender: no test of it
    table = score_tests(frame, 0.05, axes=("edit_success", "cue_retention", "skin_tone"))
    # Ordinal model rows follow the Kruskal-Wallis row of each 1-5 axis; cue retention (a
    # fraction) has none; skin tone (no score) is left out.
    assert list(zip(table["axis"], table["dimension"], table["test"], strict=True)) == [
        (a, d, t) for a in ("edit_success", "cue_retention") for d in SOURCE_DIMENSIONS
        for t in (("Kruskal-Wallis + Dunn", "proportional odds (score test)")
                  if a == "edit_success" else ("Kruskal-Wallis + Dunn",))]
    rows = table.set_index(["axis", "dimension", "test"])
    for dimension in SOURCE_DIMENSIONS:
        om = ordinal_model(frame, "edit_success", dimension)
        row = rows.loc[("edit_success", dimension, "proportional odds (score test)")]
        assert row["statistic"] == pytest.approx(om.statistic, nan_ok=True)
        assert row["df"] == pytest.approx(om.df, nan_ok=True)
        assert row["p_value"] == pytest.approx(om.p_value, nan_ok=True)
        assert (row["n"], row["n_missing"], row["posthoc"]) == (om.n, 1, "")
        assert row["note"] == "; ".join([*([om.reason] if om.reason else []), *om.notes])
    gender = rows.loc[("edit_success", "gender", "Kruskal-Wallis + Dunn")]
    assert gender["note"] == "fewer than two groups with scores"
    assert math.isnan(gender["p_value"]) and math.isnan(gender["p_adjusted"])
    assert gender["significant"] is pd.NA and gender["posthoc"] == ""
    assert rows.loc[("edit_success", "gender", "proportional odds (score test)"),
                    "note"] == "fewer than two groups with scores"
    # Holm over the finite p-values of the whole table, one family.
    finite = table["p_value"].notna()
    assert table.loc[finite, "p_adjusted"].to_numpy() == pytest.approx(
        multipletests(table.loc[finite, "p_value"], method="holm")[1])


def test_score_tests_leave_out_axes_without_a_usable_score() -> None:
    frame = race_effect_frame()
    # Skin tone scored only on errored requests, which never count.
    frame["skin_tone"] = np.where(frame["status"] == "error", 3.0, np.nan)
    table = score_tests(frame, 0.05, axes=("skin_tone", "age_change", "cue_retention"),
                        ordinal=False)
    assert set(table["axis"]) == {"cue_retention"} and len(table) == 3
    empty = score_tests(frame, 0.05, axes=("skin_tone",))
    assert list(empty.columns) == list(SCORE_TEST_COLUMNS) and empty.empty


def test_repeats_count_between_raters_only_when_asked() -> None:
    """Rater x saw item a again and answered 5: kept, item a's counts become (2, 1, 0, 0, 1)
    beside b's (0, 0, 1, 0, 2), a 4-3 design and the generalised kappa."""
    ratings, items = two_item_ratings()
    ratings = pd.concat([ratings, pd.DataFrame([rating("x", "a", repeat=True,
                                                       edit_success=5)])])
    kept = rater_agreement(ratings, items, axes=("edit_success",), arms=("edited",),
                           include_repeats=True, n_boot=0)
    row = overall(kept, "edit_success", "fleiss_kappa", "edited")
    assert row["n_ratings"] == 7
    assert row["estimate"] == pytest.approx(
        fleiss_kappa_unequal(np.array([[2, 1, 0, 0, 1], [0, 0, 1, 0, 2]])))
    left_out = rater_agreement(ratings, items, axes=("edit_success",), arms=("edited",),
                               n_boot=0)
    assert overall(left_out, "edit_success", "fleiss_kappa", "edited")["n_ratings"] == 6


def test_no_axis_gives_an_empty_table_with_the_columns() -> None:
    ratings, items = two_item_ratings()
    table = rater_agreement(ratings, items, axes=(), n_boot=0)
    assert table.empty and list(table.columns) == list(AGREEMENT_COLUMNS)


def test_judge_means_do_not_depend_on_the_order_of_the_rows() -> None:
    """Sources are sorted before their bootstrap counts are drawn, so the same requests in
    another order give the same interval."""
    frame = design_frame().assign(edit_success=np.random.default_rng(5).integers(1, 6, 84))
    shuffled = frame.sample(frac=1.0, random_state=1).reset_index(drop=True)
    assert shuffled["source_id"].tolist() != sorted(shuffled["source_id"])
    pd.testing.assert_frame_equal(judge_means(frame, n_boot=100, seed=2),
                                  judge_means(shuffled, n_boot=100, seed=2))


def test_judge_means_read_a_score_that_is_not_a_number_as_missing() -> None:
    frame = two_source_frame()
    frame["edit_success"] = frame["edit_success"].astype(object)
    frame.loc[3, "edit_success"] = "n/a"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0/0 on the axes nobody scored
        row = judge_means(frame, n_boot=50).iloc[0]
    assert (row["n"], row["n_sources"], row["mean"]) == (3, 2, 3.0)


def test_judge_agreement_counts_a_request_once_and_reads_non_numbers_as_missing() -> None:
    frame = design_frame()[:3]
    # The same request listed twice with different labels counts once, under its first.
    twice = pd.concat([frame, frame.iloc[[0]].assign(race="White")])
    first = score_table(frame, "g", edit_success=[1, 2, 3])
    second = score_table(frame, "o", edit_success=[1, 2, 4]).astype({"edit_success": object})
    second.loc[2, "edit_success"] = "n/a"
    table = judge_agreement({"g": first, "o": second}, twice)
    rows = table[table["axis"] == "edit_success"].set_index(["dimension", "group"])
    assert rows.loc[("all", "all"), "n_pairs"] == 2
    assert rows.loc[("race", "Black"), "n_pairs"] == 2
    assert rows.loc[("race", "White"), "n_pairs"] == 0
    # The same for the first judge of the pair.
    table = judge_agreement({"o": second, "g": first}, twice)
    assert table.loc[(table["axis"] == "edit_success") & (table["dimension"] == "all"),
                     "n_pairs"].iloc[0] == 2
    one = judge_agreement({"g": first}, frame)
    assert one.empty and list(one.columns) == list(JUDGE_AGREEMENT_COLUMNS)


def test_score_tests_default_alpha_is_five_percent() -> None:
    frame = race_effect_frame()
    table = score_tests(frame, axes=("edit_success",), ordinal=False)
    assert ((table["p_adjusted"] > 0.05) & (table["p_adjusted"] < 1.0)).any()
    assert table["significant"].tolist() == (table["p_adjusted"] < 0.05).tolist()
    # An adjusted p equal to alpha is not significant (p < alpha).
    race_p = float(table["p_adjusted"].iloc[0])
    exact = score_tests(frame, race_p, axes=("edit_success",), ordinal=False)
    assert not exact["significant"].iloc[0]


def test_score_tests_one_usable_score_is_tested_and_text_is_no_score() -> None:
    frame = race_effect_frame()
    frame["skin_tone"] = np.nan
    frame.loc[5, "skin_tone"] = 3.0  # one score: tested, and the test says why it cannot
    frame["age_change"] = "n/a"  # no number at all: left out
    table = score_tests(frame, 0.05, axes=("age_change", "skin_tone"), ordinal=False)
    assert table["axis"].tolist() == ["skin_tone"] * 3
    assert (table["note"] == "fewer than two groups with scores").all()
    assert table["significant"].isna().all()
    empty = score_tests(frame, 0.05, axes=("age_change",))
    assert empty["significant"].dtype == "boolean"


def test_one_replicate_is_its_own_interval() -> None:
    """n_boot = 1: the percentile interval of one replicate is that replicate, a statistic of
    a table the bootstrap can draw."""
    row = bootstrap_rows(0.95, n_boot=1).loc["fleiss_kappa"]
    assert row["ci_low"] == row["ci_high"]
    assert round(row["ci_low"], 12) in drawable_statistics("fleiss_kappa")
