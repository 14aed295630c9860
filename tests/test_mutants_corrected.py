"""Kill tests for acrb.analysis.agreement.corrected: every number of the PPI correction pinned.

Prediction-powered inference (Angelopoulos et al. 2023; PPI++, Angelopoulos, Duchi & Zrnic
2023) is re-derived here from its formulas, independently of ``ppi_py``: the rectified mean
θ = λ·mean(Ŷ_unl) + mean(Y − λŶ), its standard error sqrt(λ² Var(Ŷ_unl)/N + Var(Y − λŶ)/n)
(population variances, as the paper's CLT interval), the power-tuned λ = Cov(Y, Ŷ) /
((1 + n/N) Var(Ŷ)); the count rates and their Δ against statsmodels' Wilson and Newcombe
intervals; normal quantiles from scipy's ``norm.isf``. Small inputs have their values worked out
by hand in the comments.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

from acrb.analysis.agreement.corrected import (
    CORRECTED_DELTA_COLUMNS,
    CORRECTED_RATE_COLUMNS,
    RateEstimate,
    corrected_deltas,
    corrected_rates,
    count_rate,
    delta,
    group_estimates,
    human_outcomes,
    labelled_frame,
    power_tuned_lambda,
    ppi_rate,
)
from acrb.config import OutcomeRule
from acrb.errors import InputDataError

SOFT_ERASURE = OutcomeRule(axis="edit_success", at_most=2)

# The small labelled/unlabelled sample most tests use (worked by hand below).
Y = np.array([1.0, 0.0, 1.0, 0.0])
YHAT = np.array([1.0, 0.0, 0.0, 0.0])
UNL = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
# Cov(Y, Ŷ) over the labelled (divisor n): means 0.5 and 0.25, products 0.375, 0.125, -0.125,
# 0.125 -> 0.5 / 4 = 0.125. Var(Ŷ) over all 12 judge labels (4 ones, divisor 11):
# 12 * (1/3)(2/3) / 11 = 8/33. λ = 0.125 / ((1 + 4/8) * 8/33) = 0.125 * 33 / 12 = 0.34375.
LAMBDA = 0.34375


def z(confidence: float) -> float:
    """The two-sided normal quantile, by scipy's survival function."""
    return float(norm.isf((1 - confidence) / 2))


def ppi_by_formula(y: np.ndarray, yhat: np.ndarray, unl: np.ndarray, lam: float
                   ) -> tuple[float, float]:
    """The PPI++ point estimate and standard error for a mean (population variances)."""
    rate = lam * unl.mean() + (y - lam * yhat).mean()
    se = math.sqrt(lam ** 2 * unl.var() / len(unl) + (y - lam * yhat).var() / len(y))
    return rate, se


def wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    low, high = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    return float(low), float(high)


# ---- power_tuned_lambda ----------------------------------------------------------------------


def test_power_tuned_lambda_by_hand() -> None:
    assert power_tuned_lambda(Y, YHAT, UNL) == pytest.approx(LAMBDA, abs=1e-15)


def test_power_tuned_lambda_is_clipped_to_0_and_1() -> None:
    # Labelled judge labels that track people exactly, unlabelled ones all 0: Cov = 0.25,
    # Var over 102 labels with one 1 is about 0.0098, so the ratio is about 24 -> 1.
    assert power_tuned_lambda(np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.zeros(100)) == 1.0
    # A judge that says the opposite of people: Cov = -0.25 -> 0.
    assert power_tuned_lambda(np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.zeros(4)) == 0.0


def test_power_tuned_lambda_without_information_is_0() -> None:
    # No labelled output, no unlabelled output, a judge that gives one answer everywhere.
    assert power_tuned_lambda(np.array([]), np.array([]), np.array([1.0, 0.0])) == 0.0
    assert power_tuned_lambda(Y, YHAT, np.array([])) == 0.0
    assert power_tuned_lambda(Y, np.ones(4), np.ones(3)) == 0.0


def test_power_tuned_lambda_uses_the_unlabelled_count() -> None:
    # Twice the unlabelled outputs (each repeated): Var over 20 labels with 7 ones (divisor 19)
    # = 20 * 0.35 * 0.65 / 19 = 4.55 / 19; 1 + n/N = 1.25; λ = 0.125 * 19 / (1.25 * 4.55).
    unl = np.repeat(UNL, 2)
    assert power_tuned_lambda(Y, YHAT, unl) == pytest.approx(0.125 * 19 / (1.25 * 4.55),
                                                             rel=1e-12)


# ---- ppi_rate --------------------------------------------------------------------------------


def test_power_tuned_ppi_by_formula() -> None:
    estimate = ppi_rate(Y, YHAT, UNL)
    rate, se = ppi_by_formula(Y, YHAT, UNL, LAMBDA)
    # 0.34375 * 3/8 + (2 - 0.34375) / 4 = 0.12890625 + 0.4140625
    assert rate == pytest.approx(0.54296875)
    assert estimate.estimator == "ppi"
    assert estimate.rate == pytest.approx(rate, abs=1e-12)
    assert estimate.se == pytest.approx(se, rel=1e-9)
    assert estimate.ci_low == pytest.approx(rate - z(0.95) * se, rel=1e-9)
    assert estimate.ci_high == pytest.approx(rate + z(0.95) * se, rel=1e-9)
    assert estimate.ci_low > 0 and estimate.ci_high < 1  # no clipping here
    assert estimate.lam == pytest.approx(LAMBDA, abs=1e-15)
    assert (estimate.n_labelled, estimate.n_unlabelled) == (4, 8)
    assert (estimate.k, estimate.n, estimate.note) == (0, 0, "")


def test_ppi_at_another_confidence_and_a_given_lambda() -> None:
    estimate = ppi_rate(Y, YHAT, UNL, 0.8, lam=0.5)
    rate, se = ppi_by_formula(Y, YHAT, UNL, 0.5)
    assert estimate.lam == 0.5
    assert estimate.rate == pytest.approx(rate, abs=1e-12)
    assert estimate.se == pytest.approx(se, rel=1e-9)
    assert estimate.ci_low == pytest.approx(rate - z(0.8) * se, rel=1e-9)
    assert estimate.ci_high == pytest.approx(rate + z(0.8) * se, rel=1e-9)


def test_a_whole_number_lambda_is_kept_as_a_float() -> None:
    estimate = ppi_rate(Y, YHAT, UNL, lam=1)
    assert type(estimate.lam) is float and estimate.lam == 1.0
    rate, se = ppi_by_formula(Y, YHAT, UNL, 1.0)
    assert estimate.rate == pytest.approx(rate) and estimate.se == pytest.approx(se)


def test_ppi_reads_booleans_and_columns_as_0_1_vectors() -> None:
    as_float = ppi_rate(Y, YHAT, UNL)
    as_bool = ppi_rate(Y.astype(bool).tolist(), YHAT.astype(bool).tolist(),
                       UNL.astype(bool).tolist())
    as_column = ppi_rate(Y.reshape(-1, 1), YHAT.reshape(-1, 1), pd.Series(UNL))
    for other in (as_bool, as_column):
        assert other == as_float


def test_ppi_reads_a_column_of_python_booleans() -> None:
    # A frame column of Python bools has the object dtype (as one that once held None):
    # read as 0/1 all the same.
    as_objects = [pd.Series(v.astype(bool), dtype=object) for v in (Y, YHAT, UNL)]
    assert ppi_rate(*as_objects) == ppi_rate(Y, YHAT, UNL)


def test_the_wilson_floor_applies_when_the_rectified_labels_are_alike() -> None:
    # λ = 1 and people agree with the judge on every labelled output (two 1s, two 0s): Y − Ŷ
    # is 0 throughout though Y + Ŷ is not. 2000 unlabelled outputs make the imputed term small
    # (sqrt(0.25 / 2000) = 0.011), under the Wilson floor of 2 of 4 (about 0.18).
    unl = np.tile([1.0, 0.0], 1000)
    est = ppi_rate([1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0], unl, lam=1.0)
    low, high = wilson(2, 4, 0.95)
    assert est.se == pytest.approx((high - low) / (2 * z(0.95)), rel=1e-12)
    assert "widened" in est.note
    # The opposite: Y + Ŷ is 1 throughout but Y − Ŷ is not, so no floor is taken.
    opposite = ppi_rate([1.0, 0.0], [0.0, 1.0], unl, lam=1.0)
    _, se = ppi_by_formula(np.array([1.0, 0.0]), np.array([0.0, 1.0]), unl, 1.0)
    assert opposite.se == pytest.approx(se, rel=1e-9) and opposite.note == ""


def test_ppi_interval_is_clipped_to_0_1_but_not_the_estimate() -> None:
    # λ = 1: 7/8 + mean([0, 0, 1, 0]) = 1.125; se^2 = (7/64)/8 + (3/16)/4.
    high = ppi_rate([1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0] * 7 + [0.0], lam=1.0)
    se = math.sqrt(7 / 64 / 8 + 3 / 16 / 4)
    assert high.rate == pytest.approx(1.125)
    assert high.se == pytest.approx(se)
    assert high.ci_high == 1.0 and high.ci_low == pytest.approx(1.125 - z(0.95) * se)
    # The mirror image: 1/8 - 1/4 = -0.125.
    low = ppi_rate([0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0], [0.0] * 7 + [1.0], lam=1.0)
    assert low.rate == pytest.approx(-0.125)
    assert low.ci_low == 0.0 and low.ci_high == pytest.approx(-0.125 + z(0.95) * se)


def test_ppi_needs_two_labelled_outputs() -> None:
    one = ppi_rate([1.0], [1.0], [0.0, 1.0])
    assert one.estimator == "ppi"
    assert all(math.isnan(v) for v in (one.rate, one.ci_low, one.ci_high, one.se, one.lam))
    assert (one.n_labelled, one.n_unlabelled) == (1, 2)
    assert one.note == "fewer than two labelled outputs: no estimate"
    # Two are enough: λ = 1 gives 1/2 + mean([0, 0]) = 0.5.
    two = ppi_rate([1.0, 0.0], [1.0, 0.0], [1.0, 0.0], lam=1.0)
    assert two.rate == pytest.approx(0.5) and two.note == ""


def test_ppi_rejects_labels_of_different_lengths() -> None:
    with pytest.raises(ValueError, match=r"^2 human labels but 1 judge labels$"):
        ppi_rate([1.0, 0.0], [1.0], [0.0])


def test_ppi_without_unlabelled_outputs_is_the_human_mean() -> None:
    est = ppi_rate([1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 1.0], [], 0.9)
    # mean 0.75, population sd sqrt(0.1875), se = sd / sqrt(4).
    se = math.sqrt(0.1875) / 2
    assert est.rate == 0.75 and est.lam == 0.0
    assert est.se == pytest.approx(se, rel=1e-12)
    assert est.ci_low == pytest.approx(0.75 - z(0.9) * se, rel=1e-12)
    assert est.ci_high == pytest.approx(min(1.0, 0.75 + z(0.9) * se), rel=1e-12)
    assert est.note == "no unlabelled output: the human labels alone"
    assert (est.n_labelled, est.n_unlabelled) == (4, 0)


def test_labels_all_alike_widen_the_interval_to_wilson() -> None:
    # 20 labelled outputs, all 0 and all agreeing with the judge; the judge flags 1 in 10 of
    # the rest. λ = 0 (Cov = 0), so the PPI se is 0 and the Wilson half-width (as a standard
    # error) takes over: Wilson at k = 0 is [0, z^2 / (n + z^2)].
    unl = (np.arange(50) % 10 == 0).astype(float)
    est = ppi_rate(np.zeros(20), np.zeros(20), unl, 0.9)
    low, high = wilson(0, 20, 0.9)
    assert low == pytest.approx(0.0, abs=1e-12)
    assert high == pytest.approx(z(0.9) ** 2 / (20 + z(0.9) ** 2))
    assert est.rate == 0.0 and est.lam == 0.0
    assert est.se == pytest.approx((high - low) / (2 * z(0.9)), rel=1e-12)
    assert est.ci_low == 0.0
    assert est.ci_high == pytest.approx((high - low) / 2, rel=1e-12)
    assert est.note == ("labelled outputs all alike: interval widened to the labels' own "
                        "(Wilson) uncertainty")


def test_labels_all_ones_widen_by_their_own_count() -> None:
    # All 6 labelled outputs 1 and the judge says 1 there too, λ = 1: rectifier 0, the imputed
    # term alone; Wilson at k = n = 6 is [n / (n + z^2), 1].
    unl = np.array([1.0] * 30 + [0.0])
    est = ppi_rate(np.ones(6), np.ones(6), unl, lam=1.0)
    imputed = math.sqrt(unl.var() / 31)
    floor = (1 - 6 / (6 + z(0.95) ** 2)) / (2 * z(0.95))
    assert floor > imputed
    assert est.se == pytest.approx(floor, rel=1e-9)
    assert est.rate == pytest.approx(30 / 31)
    assert est.ci_low == pytest.approx(30 / 31 - z(0.95) * floor, rel=1e-9)
    assert "widened" in est.note


def test_alike_labels_keep_a_larger_ppi_error() -> None:
    # λ = 1 and people agree with the judge on all 4 (two 1s, two 0s): the rectifier is 0,
    # but the imputed term sqrt(0.25 / 2) = 0.354 exceeds the Wilson floor (half of about 0.7,
    # over z = 1.96: about 0.18), so the PPI error stands and nothing is noted.
    est = ppi_rate([1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0], [1.0, 0.0], lam=1.0)
    low, high = wilson(2, 4, 0.95)
    assert (high - low) / (2 * z(0.95)) < math.sqrt(0.125)
    assert est.se == pytest.approx(math.sqrt(0.125), rel=1e-9)
    assert est.note == ""


def test_human_only_labels_all_alike_note_both_reasons() -> None:
    est = ppi_rate([0.0, 0.0, 0.0], [1.0, 0.0, 1.0], [])
    low, high = wilson(0, 3, 0.95)
    assert est.se == pytest.approx((high - low) / (2 * z(0.95)), rel=1e-12)
    assert est.note == ("no unlabelled output: the human labels alone; labelled outputs all "
                        "alike: interval widened to the labels' own (Wilson) uncertainty")


# ---- count_rate, delta, group_estimates ------------------------------------------------------


def test_count_rate_is_k_over_n_with_wilson() -> None:
    est = count_rate("judge", np.array([1.0, 1.0, 0.0, 0.0, 0.0]), 7, 3, 0.9)
    assert est == RateEstimate("judge", 0.4, *wilson(2, 5, 0.9), 7, 3, k=2, n=5)
    default = count_rate("human", np.array([1.0, 0.0, 0.0, 0.0]), 4, 0)
    assert (default.ci_low, default.ci_high) == pytest.approx(wilson(1, 4, 0.95), abs=1e-12)
    assert default.estimator == "human" and default.rate == 0.25


def test_count_rate_of_no_output() -> None:
    est = count_rate("human", np.array([]), 0, 5)
    assert est.estimator == "human" and (est.k, est.n) == (0, 0)
    assert math.isnan(est.rate) and math.isnan(est.ci_low) and math.isnan(est.ci_high)
    assert est.note == "no output" and (est.n_labelled, est.n_unlabelled) == (0, 5)


def ppi_estimate(rate: float, se: float) -> RateEstimate:
    return RateEstimate("ppi", rate, math.nan, math.nan, 10, 10, se=se)


def test_ppi_delta_adds_the_variances() -> None:
    # se = sqrt(0.3^2 + 0.4^2) = 0.5; Δ = 0.5 - z·0.5 ... clipped at 1 above.
    d = delta(ppi_estimate(0.6, 0.3), ppi_estimate(0.1, 0.4), 0.9)
    assert d.estimator == "ppi" and d.note == ""
    assert d.delta == pytest.approx(0.5) and d.se == pytest.approx(0.5)
    assert d.ci_low == pytest.approx(0.5 - z(0.9) * 0.5) and d.ci_high == 1.0
    mirror = delta(ppi_estimate(0.1, 0.3), ppi_estimate(0.6, 0.4))
    assert mirror.ci_low == -1.0 and mirror.ci_high == pytest.approx(-0.5 + z(0.95) * 0.5)
    # Unclipped on both sides: se = sqrt(0.03^2 + 0.04^2) = 0.05.
    narrow = delta(ppi_estimate(0.3, 0.03), ppi_estimate(0.2, 0.04))
    assert (narrow.ci_low, narrow.ci_high) == pytest.approx(
        (0.1 - z(0.95) * 0.05, 0.1 + z(0.95) * 0.05))


def test_count_delta_is_newcombe() -> None:
    a = count_rate("human", np.array([1.0] * 3 + [0.0] * 7), 10, 0)
    b = count_rate("human", np.array([1.0] * 6 + [0.0] * 4), 10, 0)
    d = delta(a, b, 0.9)
    expected = confint_proportions_2indep(3, 10, 6, 10, method="newcomb", compare="diff",
                                          alpha=0.1)
    assert d.estimator == "human" and d.delta == pytest.approx(-0.3)
    assert (d.ci_low, d.ci_high) == pytest.approx(tuple(map(float, expected)), abs=1e-12)
    assert math.isnan(d.se) and d.note == ""
    judged = delta(count_rate("judge", np.ones(4), 4, 0), count_rate("judge", np.zeros(4), 4, 0))
    at_95 = confint_proportions_2indep(4, 4, 0, 4, method="newcomb", compare="diff")
    assert judged.estimator == "judge"
    assert (judged.ci_low, judged.ci_high) == pytest.approx(tuple(map(float, at_95)), abs=1e-12)


def test_delta_of_a_group_without_estimate() -> None:
    missing = count_rate("judge", np.array([]), 0, 0)
    present = count_rate("judge", np.array([1.0, 0.0]), 2, 0)
    for a, b in ((missing, present), (present, missing)):
        d = delta(a, b)
        assert d.estimator == "judge" and d.note == "a group has no estimate"
        assert all(math.isnan(v) for v in (d.delta, d.ci_low, d.ci_high, d.se))


def test_delta_refuses_two_estimators() -> None:
    with pytest.raises(ValueError, match=r"^cannot take Δ of a ppi and a human estimate$"):
        delta(ppi_estimate(0.1, 0.1), count_rate("human", np.ones(2), 2, 0))


def test_group_estimates() -> None:
    estimates = group_estimates(Y, YHAT, UNL, 0.8)
    assert list(estimates) == ["judge", "human", "ppi"]
    # The judge over all 12 outputs (4 ones), people over the 4 labelled (2 ones).
    assert estimates["judge"] == RateEstimate("judge", 4 / 12, *wilson(4, 12, 0.8), 4, 8,
                                              k=4, n=12)
    assert estimates["human"] == RateEstimate("human", 0.5, *wilson(2, 4, 0.8), 4, 8, k=2, n=4)
    assert estimates["ppi"] == ppi_rate(Y, YHAT, UNL, 0.8)
    default = group_estimates(Y, YHAT, UNL)
    assert (default["judge"].ci_low, default["human"].ci_high) == pytest.approx(
        (wilson(4, 12, 0.95)[0], wilson(2, 4, 0.95)[1]))
    assert default["ppi"] == ppi_rate(Y, YHAT, UNL, 0.95)


# ---- human_outcomes, labelled_frame ----------------------------------------------------------


def review(random_sample: list[object] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Five review items; ratings of three raters (and one repeat) on both outputs."""
    items = pd.DataFrame({
        "item_id": ["i1", "i2", "i3", "i4", "i5"],
        "request_id": ["r1", "r2", "r3", None, "r5"],
        "paired_request_id": ["p1", "p2", "p3", None, None],
        "random_sample": random_sample or [True, True, False, True, True],
    })
    scores = {  # (item, output) -> three raters' edit_success
        ("i1", "edited"): (1, 2, 5),  # median 2 (erased); mean 2.67 -> 3 (not)
        ("i2", "edited"): (4, 4, 4),
        ("i3", "edited"): (1, 1, 1),  # not a random-sample item
        ("i4", "edited"): (1, 1, 1),  # no request id (an imported survey item)
        ("i5", "edited"): (None, None, None),  # nobody could tell
        ("i1", "feature"): (4, 4, 5),
        ("i2", "feature"): (1, 1, 2),
    }
    ratings = [{"rater": rater, "item_id": item, "output": output, "repeat": False,
                "edit_success": score}
               for (item, output), three in scores.items() for rater, score in zip("abc", three,
                                                                                    strict=True)]
    # A repeated rating is not a between-rater answer and must not move i2's consensus.
    ratings.append({"rater": "a", "item_id": "i2", "output": "edited", "repeat": True,
                    "edit_success": 1})
    return pd.DataFrame(ratings), items


def test_human_outcomes_of_the_edited_output() -> None:
    ratings, items = review()
    human = human_outcomes(ratings, items, SOFT_ERASURE)
    expected = pd.DataFrame({"request_id": ["r1", "r2", "r5"], "item_id": ["i1", "i2", "i5"],
                             "human": pd.array([True, False, None], dtype="boolean")})
    pd.testing.assert_frame_equal(human, expected)


def test_human_outcomes_with_the_mean_consensus() -> None:
    ratings, items = review()
    human = human_outcomes(ratings, items, SOFT_ERASURE, consensus_rule="mean")
    assert human["human"].tolist() == [False, False, pd.NA]


def test_human_outcomes_of_the_feature_output_name_the_paired_request() -> None:
    ratings, items = review()
    human = human_outcomes(ratings, items, SOFT_ERASURE, output="feature")
    expected = pd.DataFrame({"request_id": ["p1", "p2"], "item_id": ["i1", "i2"],
                             "human": pd.array([False, True], dtype="boolean")})
    pd.testing.assert_frame_equal(human, expected)


def test_human_outcomes_nobody_could_tell_are_still_boolean() -> None:
    ratings, items = review()
    unsure = ratings.assign(edit_success=None)
    human = human_outcomes(unsure, items, SOFT_ERASURE)
    assert str(human["human"].dtype) == "boolean" and human["human"].isna().all()
    none = human_outcomes(ratings, items.assign(random_sample=False), SOFT_ERASURE)
    assert len(none) == 0 and str(none["human"].dtype) == "boolean"


def test_human_outcomes_read_a_0_1_random_sample_column() -> None:
    ratings, items = review([1, 1, 0, 1, 1])
    assert human_outcomes(ratings, items, SOFT_ERASURE)["item_id"].tolist() == ["i1", "i2", "i5"]


def test_human_outcomes_need_the_items_columns() -> None:
    ratings, items = review()
    with pytest.raises(InputDataError, match="random_sample"):
        human_outcomes(ratings, items.drop(columns="random_sample"), SOFT_ERASURE)


def analysis_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "request_id": ["r1", "r2", "r3", "r4", "r5"],
        "status": ["ok", "refused", "error", "ok", "ok"],
        "race": ["Black", "White", "Black", "White", "Indian"],
        "gender": ["Female", "Male", "Female", "Male", "Female"],
        "age": ["20s", "30s", "20s", "30s", "40s"],
        "soft_erasure": [True, False, True, None, True],
    })


def test_labelled_frame_keeps_judged_usable_rows_with_their_label() -> None:
    human = pd.DataFrame({"request_id": ["r2", "r9"],
                          "human": pd.array([True, False], dtype="boolean")})
    labelled = labelled_frame(analysis_frame(), "soft_erasure", human)
    # r3 errored, r4 was not judged; r2 has a label, r9 is not in the frame.
    expected = pd.DataFrame({"request_id": ["r1", "r2", "r5"],
                             "race": ["Black", "White", "Indian"],
                             "gender": ["Female", "Male", "Female"],
                             "age": ["20s", "30s", "40s"],
                             "judge": [True, False, True],
                             "human": pd.array([None, True, None], dtype="boolean")})
    pd.testing.assert_frame_equal(labelled, expected)


def test_labelled_frame_refuses_a_request_labelled_twice() -> None:
    human = pd.DataFrame({"request_id": ["r1", "r2", "r2"],
                          "human": pd.array([True, False, True], dtype="boolean")})
    with pytest.raises(InputDataError) as err:
        labelled_frame(analysis_frame(), "soft_erasure", human)
    assert err.value.problem == "request 'r2' has two human labels"
    assert err.value.fix == ("a request is one review item; check the review set for repeated "
                             "items")


def test_labelled_frame_needs_its_columns() -> None:
    human = pd.DataFrame({"request_id": ["r1"], "human": pd.array([True], dtype="boolean")})
    with pytest.raises(InputDataError, match="soft_erasure"):
        labelled_frame(analysis_frame().drop(columns="soft_erasure"), "soft_erasure", human)
    with pytest.raises(InputDataError, match="human"):
        labelled_frame(analysis_frame(), "soft_erasure", human.drop(columns="human"))


# ---- corrected_rates, corrected_deltas -------------------------------------------------------


def labelled_groups(spec: dict[str, tuple[list[int], list[int], list[int]]]) -> pd.DataFrame:
    """A labelled frame from, per race: (human labels, judge labels there, other judge labels).
    Gender alternates Female/Male down the rows; age is 20s throughout."""
    rows = []
    for race, (y, yhat, unl) in spec.items():
        for i, (h, j) in enumerate(zip(y, yhat, strict=True)):
            rows.append({"request_id": f"{race}-l{i}", "race": race, "judge": bool(j),
                         "human": bool(h)})
        for i, j in enumerate(unl):
            rows.append({"request_id": f"{race}-u{i}", "race": race, "judge": bool(j),
                         "human": pd.NA})
    frame = pd.DataFrame(rows)
    frame["gender"] = ["Female", "Male"] * (len(frame) // 2) + ["Female"] * (len(frame) % 2)
    frame["age"] = "20s"
    return frame.astype({"human": "boolean"})


SPEC = {
    "White": ([1, 0, 1, 0], [1, 0, 0, 0], [1, 0, 1, 1, 0, 0, 0, 0]),
    "Black": ([1, 1, 0, 0, 0], [1, 1, 1, 0, 1], [1, 1, 1, 0, 0, 1]),
    "Latino": ([0, 0, 1], [0, 1, 1], [0, 0, 0, 0, 1]),
}


def arrays(labels: list[int]) -> np.ndarray:
    return np.array(labels, dtype=float)


def expected_rows(dimension: str, group: str, y: np.ndarray, yhat: np.ndarray, unl: np.ndarray,
                  confidence: float) -> list[dict[str, object]]:
    n, big_n = len(y), len(unl)
    judged = np.concatenate([yhat, unl])
    kj, kh = int(judged.sum()), int(y.sum())
    ppi = ppi_rate(y, yhat, unl, confidence)
    base = {"outcome": "soft_erasure", "dimension": dimension, "group": group,
            "n_labelled": n, "n_unlabelled": big_n}
    return [
        {**base, "estimator": "judge", "rate": kj / len(judged),
         "ci_low": wilson(kj, len(judged), confidence)[0],
         "ci_high": wilson(kj, len(judged), confidence)[1], "se": math.nan, "lam": math.nan,
         "note": ""},
        {**base, "estimator": "human", "rate": kh / n, "ci_low": wilson(kh, n, confidence)[0],
         "ci_high": wilson(kh, n, confidence)[1], "se": math.nan, "lam": math.nan, "note": ""},
        {**base, "estimator": "ppi", "rate": ppi.rate, "ci_low": ppi.ci_low,
         "ci_high": ppi.ci_high, "se": ppi.se, "lam": ppi.lam, "note": ppi.note},
    ]


def test_corrected_rates_every_column() -> None:
    labelled = labelled_groups(SPEC)
    rates = corrected_rates(labelled, "soft_erasure", dimensions=("race",), confidence=0.9)
    everything = [arrays([x for r in SPEC for x in SPEC[r][part]]) for part in range(3)]
    # Pooled first, then the races in the vocabulary's order (Black, Latino, White; the other
    # races have no output and no rows).
    expected = expected_rows("all", "all", *everything, 0.9)
    for race in ("Black", "Latino", "White"):
        expected += expected_rows("race", race, *map(arrays, SPEC[race]), 0.9)
    pd.testing.assert_frame_equal(
        rates, pd.DataFrame(expected, columns=list(CORRECTED_RATE_COLUMNS)), rtol=1e-12)
    # White's PPI row is the hand-worked sample: λ = 0.34375.
    white = rates[(rates["group"] == "White") & (rates["estimator"] == "ppi")].iloc[0]
    assert white["lam"] == pytest.approx(LAMBDA)


def test_corrected_rates_by_default_cover_every_dimension_at_95() -> None:
    labelled = labelled_groups(SPEC)
    rates = corrected_rates(labelled, "soft_erasure")
    assert list(dict.fromkeys(zip(rates["dimension"], rates["group"], strict=True))) == [
        ("all", "all"), ("race", "Black"), ("race", "Latino"), ("race", "White"),
        ("gender", "Female"), ("gender", "Male"), ("age", "20s")]
    assert rates["estimator"].tolist() == ["judge", "human", "ppi"] * 7
    pooled = rates.iloc[:3]
    n_all = sum(len(SPEC[r][0]) + len(SPEC[r][2]) for r in SPEC)
    k_all = sum(sum(SPEC[r][1]) + sum(SPEC[r][2]) for r in SPEC)
    assert (pooled["ci_low"].iloc[0], pooled["ci_high"].iloc[0]) == pytest.approx(
        wilson(k_all, n_all, 0.95))
    female = labelled[labelled["gender"] == "Female"]
    labelled_female = female["human"].notna().to_numpy()
    row = rates[(rates["group"] == "Female") & (rates["estimator"] == "human")].iloc[0]
    assert row["n_labelled"] == labelled_female.sum()
    assert row["n_unlabelled"] == (~labelled_female).sum()


def test_corrected_deltas_of_a_named_pair() -> None:
    labelled = labelled_groups(SPEC)
    deltas = corrected_deltas(labelled, "soft_erasure", "race", pair=("Black", "White"),
                              confidence=0.9)
    assert list(deltas.columns) == list(CORRECTED_DELTA_COLUMNS)
    black = group_estimates(*map(arrays, SPEC["Black"]), confidence=0.9)
    white = group_estimates(*map(arrays, SPEC["White"]), confidence=0.9)
    # Judge: Black 8 of 11 (4 + 4), White 4 of 12; people: Black 2 of 5, White 2 of 4.
    judge = confint_proportions_2indep(8, 11, 4, 12, method="newcomb", compare="diff",
                                       alpha=0.1)
    human = confint_proportions_2indep(2, 5, 2, 4, method="newcomb", compare="diff", alpha=0.1)
    se = math.hypot(black["ppi"].se, white["ppi"].se)
    d = black["ppi"].rate - white["ppi"].rate
    base = {"outcome": "soft_erasure", "dimension": "race", "group_a": "Black",
            "group_b": "White", "note": ""}
    expected = pd.DataFrame([
        {**base, "estimator": "judge", "delta": 8 / 11 - 4 / 12, "ci_low": float(judge[0]),
         "ci_high": float(judge[1]), "se": math.nan},
        {**base, "estimator": "human", "delta": 2 / 5 - 2 / 4, "ci_low": float(human[0]),
         "ci_high": float(human[1]), "se": math.nan},
        {**base, "estimator": "ppi", "delta": d, "ci_low": max(-1.0, d - z(0.9) * se),
         "ci_high": min(1.0, d + z(0.9) * se), "se": se},
    ], columns=list(CORRECTED_DELTA_COLUMNS))
    pd.testing.assert_frame_equal(deltas, expected, rtol=1e-12)


def test_corrected_deltas_estimate_the_groups_at_the_confidence_asked() -> None:
    # Labels all alike in both groups: each PPI error is the Wilson floor, which depends on
    # the confidence (unlike an interval's width over 2z).
    spec = {"White": ([0] * 6, [0] * 6, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            "Black": ([1] * 5, [1] * 5, [1, 1, 1, 1, 0, 1, 1, 1, 1, 1])}
    deltas = corrected_deltas(labelled_groups(spec), "soft_erasure", "race",
                              pair=("Black", "White"), confidence=0.8).set_index("estimator")
    black = ppi_rate(*map(arrays, spec["Black"]), 0.8)
    white = ppi_rate(*map(arrays, spec["White"]), 0.8)
    assert "widened" in black.note and "widened" in white.note
    assert black.se != pytest.approx(ppi_rate(*map(arrays, spec["Black"])).se)
    assert deltas.loc["ppi", "se"] == pytest.approx(math.hypot(black.se, white.se), rel=1e-12)


def test_corrected_deltas_default_confidence_is_95() -> None:
    labelled = labelled_groups(SPEC)
    deltas = corrected_deltas(labelled, "soft_erasure", "race", pair=("White", "Black"))
    judge = confint_proportions_2indep(4, 12, 8, 11, method="newcomb", compare="diff")
    row = deltas.set_index("estimator").loc["judge"]
    assert (row["group_a"], row["group_b"]) == ("White", "Black")
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(tuple(map(float, judge)), abs=1e-12)


def test_corrected_deltas_of_the_extreme_pair_are_bonferroni_over_the_pairs() -> None:
    labelled = labelled_groups(SPEC)
    rates = {race: ppi_rate(*map(arrays, SPEC[race])).rate for race in SPEC}
    high, low = max(rates, key=rates.get), min(rates, key=rates.get)  # type: ignore[arg-type]
    assert len({high, low}) == 2
    picked = corrected_deltas(labelled, "soft_erasure", "race")
    # 3 groups: 3 pairs, each at 1 - 0.05/3.
    named = corrected_deltas(labelled, "soft_erasure", "race", pair=(high, low),
                             confidence=1 - 0.05 / 3)
    note = "max - min of the PPI rates; simultaneous interval (Bonferroni over 3 pairs)"
    assert picked["note"].tolist() == [note] * 3
    pd.testing.assert_frame_equal(picked.drop(columns="note"), named.drop(columns="note"))
    assert picked["delta"].iloc[2] == pytest.approx(rates[high] - rates[low])


def test_two_groups_make_one_pair_and_unestimated_groups_are_left_out() -> None:
    spec = {**SPEC, "Indian": ([1], [0], [1, 1, 1])}  # one label: no PPI estimate
    labelled = labelled_groups(spec)
    two = {race: SPEC[race] for race in ("White", "Black")}
    picked = corrected_deltas(labelled_groups(two), "soft_erasure", "race")
    named = corrected_deltas(labelled_groups(two), "soft_erasure", "race",
                             pair=(picked["group_a"].iloc[0], picked["group_b"].iloc[0]))
    assert picked["note"].iloc[0] == ("max - min of the PPI rates; simultaneous interval "
                                      "(Bonferroni over 1 pairs)")
    pd.testing.assert_frame_equal(picked.drop(columns="note"), named.drop(columns="note"))
    with_indian = corrected_deltas(labelled, "soft_erasure", "race")
    assert "Bonferroni over 3 pairs" in with_indian["note"].iloc[0]
    assert "Indian" not in set(with_indian[["group_a", "group_b"]].to_numpy().ravel())


def test_ties_in_the_ppi_rate_rank_by_group_name() -> None:
    same = ([1, 0, 1, 0], [1, 0, 0, 0], [1, 0, 1, 1, 0, 0, 0, 0])
    picked = corrected_deltas(labelled_groups({"White": same, "Black": same, "Latino": same}),
                              "soft_erasure", "race")
    # Equal rates sort by name: Black first (the minimum), White last (the maximum).
    assert (picked["group_a"].iloc[0], picked["group_b"].iloc[0]) == ("White", "Black")
    assert picked["delta"].tolist() == [0.0, 0.0, 0.0]


def test_fewer_than_two_estimated_groups_give_no_delta() -> None:
    labelled = labelled_groups({"White": SPEC["White"], "Indian": ([1], [0], [1, 1])})
    deltas = corrected_deltas(labelled, "soft_erasure", "race")
    assert list(deltas.columns) == list(CORRECTED_DELTA_COLUMNS)
    assert deltas["estimator"].tolist() == ["judge", "human", "ppi"]
    assert (deltas["outcome"] == "soft_erasure").all() and (deltas["dimension"] == "race").all()
    assert (deltas["group_a"] == "").all() and (deltas["group_b"] == "").all()
    assert deltas[["delta", "ci_low", "ci_high", "se"]].isna().all().all()
    assert (deltas["note"] == "fewer than two groups with a PPI estimate").all()


def test_a_named_pair_with_an_unestimated_group_says_so() -> None:
    labelled = labelled_groups({"White": SPEC["White"], "Indian": ([1], [0], [1, 1])})
    deltas = corrected_deltas(labelled, "soft_erasure", "race",
                              pair=("White", "Indian")).set_index("estimator")
    assert deltas.loc["ppi", "note"] == "a group has no estimate"
    assert math.isnan(deltas.loc["ppi", "delta"])
    assert deltas.loc["judge", "note"] == "" and deltas.loc["human", "note"] == ""


def test_corrected_deltas_refuse_unknown_dimensions_and_absent_groups() -> None:
    labelled = labelled_groups(SPEC)
    with pytest.raises(InputDataError) as err:
        corrected_deltas(labelled, "soft_erasure", "skin")
    assert err.value.problem == "unknown source dimension 'skin'"
    assert err.value.fix == "use one of ['race', 'gender', 'age']"
    with pytest.raises(InputDataError) as err:
        corrected_deltas(labelled, "soft_erasure", "race", pair=("Indian", "White"))
    assert err.value.problem == "no judged output of race group(s) ['Indian']"
    assert err.value.fix == ("name two groups present in the frame: ['Black', 'Latino', "
                             "'White']")
